import { Widget } from '@lumino/widgets';

import { ActorsView } from '../actorsView';
import { CellsView } from '../cellsView';
import { formatClock } from '../format';
import { ForwardsView } from '../forwardsView';
import { LinkView } from '../linkView';
import { NodesView } from '../nodesView';
import { RunsView } from '../runsView';
import { SectionView } from '../section';
import { FakeComm, connected, flush } from './fakes';
import * as fx from './fixtures';

/** A view attached to the page, following a connection that got `messages`. */
function show<T extends SectionView>(view: T, messages = fx.session) {
  const { kernel, comm, connection } = connected(messages);
  comm.sent = [];
  view.connection = connection;
  Widget.attach(view, document.body);
  return { view, kernel, comm, connection };
}

function rows(view: Widget, selector: string): HTMLElement[] {
  return Array.from(view.node.querySelectorAll<HTMLElement>(selector));
}

function text(node: Element | null): string {
  return node?.textContent ?? '';
}

function click(node: Element | null): void {
  if (!(node instanceof HTMLElement)) {
    throw new Error('nothing to click');
  }
  node.click();
}

/** Answer the last request the panel sent on `comm`. */
function reply(comm: FakeComm, ok: boolean, message: string): void {
  const last = comm.sent[comm.sent.length - 1] as { request: number };
  comm.receive({ type: 'reply', request: last.request, ok, message });
}

afterEach(() => {
  document.body.replaceChildren();
  jest.useRealTimers();
  jest.restoreAllMocks();
});

describe('NodesView', () => {
  it('draws one row per node with bars of the right widths and texts', () => {
    const { view } = show(new NodesView());
    const nodes = rows(view, '.jc-node');
    expect(nodes.map(n => n.dataset.nodeId)).toEqual([
      'a1b2c3',
      'd4e5f6',
      '0a9b8c'
    ]);

    const bar = (node: HTMLElement, resource: string) =>
      node.querySelector<HTMLElement>(`.jc-bar[data-resource="${resource}"]`);
    const width = (node: HTMLElement, resource: string) =>
      bar(node, resource)?.querySelector<HTMLElement>('.jc-bar-fill')?.style
        .width;

    const [head, gpu, dead] = nodes;
    expect(text(head.querySelector('.jc-node-address'))).toBe('10.0.0.1');
    expect(text(head.querySelector('.jc-tag'))).toBe('head');
    expect(text(bar(head, 'cpu'))).toBe('1.2/4 CPU');
    expect(width(head, 'cpu')).toBe('30%');
    expect(bar(head, 'gpu')).toBeNull();
    expect(text(bar(head, 'ram'))).toBe('512 MiB / 2 GiB RAM');
    expect(width(head, 'ram')).toBe('25%');
    expect(text(bar(head, 'store'))).toBe('0 B / 1 GiB store');
    expect(width(head, 'store')).toBe('0%');

    expect(gpu.querySelector('.jc-tag')).toBeNull();
    expect(text(bar(gpu, 'gpu'))).toBe('1.5/2 GPU');
    expect(width(gpu, 'gpu')).toBe('75%');
    expect(bar(gpu, 'gpu')?.title).toContain('GPU memory 6 GiB of 32 GiB');
    expect(width(gpu, 'cpu')).toBe('100%');
    expect(bar(gpu, 'cpu')?.classList).toContain('jc-bar-high');
    expect(width(gpu, 'ram')).toBe('93.8%');
    expect(text(bar(gpu, 'store'))).toBe('1.5 GiB / 8 GiB store');
    expect(bar(gpu, 'store')?.classList).not.toContain('jc-bar-high');

    expect(head.classList).not.toContain('jc-node-dead');
    expect(dead.classList).toContain('jc-node-dead');
    expect(width(dead, 'store')).toBe('0%');
  });

  it('redraws when new nodes come', () => {
    const { view, comm } = show(new NodesView());
    comm.receive({ ...fx.nodes, nodes: fx.nodes.nodes.slice(0, 1) });
    expect(rows(view, '.jc-node')).toHaveLength(1);
  });

  it("counts other notebooks' work apart, and says nothing when there is none", () => {
    const { view, comm } = show(new NodesView());
    const others = () =>
      view.node.querySelector<HTMLElement>('.jc-nodes-others');
    expect(others()?.hidden).toBe(true); // the fixture's kernel sent none
    const said = 'other notebooks and drivers: 1 actor alive, 4 tasks running';
    comm.receive({ ...fx.nodes, others: said });
    expect(others()?.hidden).toBe(false);
    expect(text(others())).toBe(said);
    expect(others()?.title).toContain("other notebooks' cells");
    comm.receive({ ...fx.nodes, others: '' });
    expect(others()?.hidden).toBe(true);
  });

  it('greys figures older than two seconds and says their age', () => {
    jest.useFakeTimers({ doNotFake: ['queueMicrotask', 'nextTick'] });
    jest.setSystemTime(fx.T0 * 1000);
    const { view, comm } = show(new NodesView());
    comm.receive({ ...fx.nodes, age: 0 });
    const body = view.node.querySelector<HTMLElement>('.jc-section-body')!;
    const age = view.node.querySelector<HTMLElement>('.jc-nodes-age')!;
    view.showAge(fx.T0 + 1);
    expect(body.classList).not.toContain('jc-nodes-stale');
    expect(age.hidden).toBe(true);
    view.showAge(fx.T0 + 7);
    expect(body.classList).toContain('jc-nodes-stale');
    expect(age.hidden).toBe(false);
    expect(text(age)).toBe('as of 7s ago');
    jest.setSystemTime((fx.T0 + 7) * 1000);
    comm.receive({ ...fx.nodes, age: 0.5 }); // a new sample, half a second old: current again
    view.showAge(fx.T0 + 7.5);
    expect(body.classList).not.toContain('jc-nodes-stale');
  });
});

describe('CellsView', () => {
  beforeEach(() => {
    jest.useFakeTimers({ doNotFake: ['queueMicrotask', 'nextTick'] });
    jest.setSystemTime(fx.T0 * 1000);
  });

  it('lists the cells with status, progress, where and elapsed time', () => {
    const { view } = show(new CellsView());
    const cells = rows(view, '.jc-cell');
    expect(cells.map(c => c.dataset.cellId)).toEqual([
      'c-map',
      'c-fg',
      'c-queued',
      'c-done',
      'c-failed'
    ]);
    const [map, fg, queued, done, failed] = cells;
    expect(map.classList).toContain('jc-status-running');
    expect(text(map.querySelector('.jc-badge'))).toBe('running');
    expect(text(map.querySelector('.jc-progress'))).toBe('3/8 items · 2 tasks');
    expect(text(map.querySelector('.jc-elapsed'))).toBe('42s');
    expect(text(fg.querySelector('.jc-row-detail'))).toBe(
      'task · 10.0.0.2 · the notebook waits on it'
    );
    expect(text(queued.querySelector('.jc-row-detail'))).toBe('actor counter');
    expect(done.classList).toContain('jc-status-done');
    expect(text(done.querySelector('.jc-elapsed'))).toBe('3 min 07 s');
    expect(failed.classList).toContain('jc-status-failed');
    expect(text(failed.querySelector('.jc-cell-label'))).toBe('jc.tune(train)');

    const cancellable = rows(view, '.jc-cancel').map(
      b => b.closest<HTMLElement>('.jc-cell')?.dataset.cellId
    );
    expect(cancellable).toEqual(['c-map', 'c-fg', 'c-queued']);
    expect(rows(view, '.jc-cancel')[0].title).toBe('Cancel this cell');
  });

  it('ticks the running cells each second, only while visible', () => {
    const { view } = show(new CellsView());
    const elapsed = () =>
      text(view.node.querySelector('[data-cell-id="c-map"] .jc-elapsed'));
    jest.advanceTimersByTime(2000);
    expect(elapsed()).toBe('44s');
    expect(
      text(view.node.querySelector('[data-cell-id="c-done"] .jc-elapsed'))
    ).toBe('3 min 07 s');
    view.hide();
    jest.advanceTimersByTime(5000);
    expect(elapsed()).toBe('44s');
    expect(jest.getTimerCount()).toBe(0);
    view.show();
    jest.advanceTimersByTime(1000);
    expect(elapsed()).toBe('50s');
  });

  it('runs no timer when nothing runs', () => {
    show(new CellsView(), [
      fx.hello,
      fx.linkConnected,
      { type: 'cells', cells: fx.cells.cells.slice(3) }
    ]);
    expect(jest.getTimerCount()).toBe(0);
  });

  it('cancels an async cell with a cancel request', async () => {
    const { view, comm, kernel } = show(new CellsView());
    click(view.node.querySelector('[data-cell-id="c-map"] .jc-cancel'));
    await flush();
    expect(comm.sent).toEqual([{ type: 'cancel', request: 1, cell: 'c-map' }]);
    expect(kernel.interrupt).not.toHaveBeenCalled();
  });

  it('cancels a foreground cell by interrupting the kernel', async () => {
    const { view, comm, kernel } = show(new CellsView());
    click(view.node.querySelector('[data-cell-id="c-fg"] .jc-cancel'));
    await flush();
    expect(kernel.interrupt).toHaveBeenCalledTimes(1);
    expect(comm.sent).toEqual([]);
  });

  it("shows a refused cancel's message in the row", async () => {
    const { view, comm } = show(new CellsView());
    click(view.node.querySelector('[data-cell-id="c-queued"] .jc-cancel'));
    await flush();
    reply(comm, false, 'cell c-queued is not running any more');
    await flush();
    const row = view.node.querySelector('[data-cell-id="c-queued"]');
    expect(text(row?.querySelector('.jc-error') ?? null)).toBe(
      'cell c-queued is not running any more'
    );
    expect(view.node.querySelectorAll('.jc-cell .jc-error')).toHaveLength(1);
  });
});

describe('ActorsView', () => {
  it('lists the actors with their node and running cell', () => {
    const { view } = show(new ActorsView());
    const actors = rows(view, '.jc-actor');
    expect(actors.map(a => a.dataset.actor)).toEqual(['counter', 'model']);
    expect(text(actors[0].querySelector('.jc-row-detail'))).toBe(
      '10.0.0.2 · running Cell In[5]'
    );
    expect(actors[1].classList).toContain('jc-actor-broken');
    expect(text(actors[1])).toContain('its node 10.0.0.3 left the cluster');
  });

  it('kills an actor with a request, and shows a refusal inline', async () => {
    const { view, comm } = show(new ActorsView());
    click(view.node.querySelector('.jc-actor[data-actor="counter"] .jc-kill'));
    await flush();
    expect(comm.sent).toEqual([
      { type: 'kill_actor', request: 1, name: 'counter' }
    ]);
    reply(comm, false, 'RayActorError: the actor is dead');
    await flush();
    const row = view.node.querySelector('.jc-actor[data-actor="counter"]');
    expect(text(row?.querySelector('.jc-error') ?? null)).toBe(
      'RayActorError: the actor is dead'
    );
  });
});

describe('RunsView', () => {
  it('shows the best metric, the counts and the elapsed time', () => {
    jest.useFakeTimers({ doNotFake: ['queueMicrotask', 'nextTick'] });
    jest.setSystemTime(fx.T0 * 1000);
    const { view } = show(new RunsView());
    const [tune, train] = rows(view, '.jc-run');
    expect(tune.dataset.runId).toBe('c-tune');
    expect(text(tune.querySelector('.jc-row-detail'))).toBe(
      'best loss 0.1235 (min) · 4 running · 2 done · 1 errored'
    );
    expect(text(tune.querySelector('.jc-elapsed'))).toBe('2m 05s');
    expect(text(tune.querySelector('.jc-tag'))).toBe('tune');
    expect(text(train.querySelector('.jc-row-detail'))).toBe(
      'last accuracy 0.931 · 2 running'
    );
    // Ended: its run time, as its widget and result write it.
    expect(text(train.querySelector('.jc-elapsed'))).toBe('10 min 00 s');
    expect(train.classList).toContain('jc-status-done');
    // Running: its clock goes on between messages.
    jest.advanceTimersByTime(3000);
    expect(text(tune.querySelector('.jc-elapsed'))).toBe('2m 08s');
    expect(text(train.querySelector('.jc-elapsed'))).toBe('10 min 00 s');
    jest.useRealTimers();
  });
});

describe('ForwardsView', () => {
  it('links the local end in a new tab', () => {
    const { view } = show(new ForwardsView());
    const link = view.node.querySelector<HTMLAnchorElement>('.jc-forward a');
    expect(link?.href).toBe('http://127.0.0.1:41235/');
    expect(link?.target).toBe('_blank');
    expect(text(view.node.querySelector('.jc-forward .jc-row-detail'))).toBe(
      '→ head:8265'
    );
  });
});

describe('LinkView', () => {
  function linkView(confirmDown = true) {
    const openDashboard = jest.fn();
    const view = new LinkView({
      openDashboard,
      confirmDown: () => confirmDown
    });
    return { openDashboard, view };
  }

  it('says the state of a connected link and its versions', () => {
    const { view } = show(linkView().view);
    expect(text(view.node.querySelector('.jc-link-state'))).toBe('connected');
    expect(view.node.querySelector('.jc-link-state')?.classList).toContain(
      'jc-state-connected'
    );
    expect(text(view.node.querySelector('.jc-link-status'))).toBe(
      'connected · 12 ms round trip'
    );
    expect(text(view.node)).toContain(
      'session local-3f2a · Ray 2.49.1 · Python 3.11.7'
    );
  });

  it('names the target unless the kind names it already', () => {
    const local = show(linkView().view).view;
    expect(text(local.node.querySelector('.jc-link-kind'))).toBe(
      'embedded local'
    );
    expect(text(local.node.querySelector('.jc-link-target'))).toBe(
      '/tmp/jupyter_cluster-0/agent.sock'
    );
    const ssh = show(linkView().view, [fx.hello, fx.linkSsh]).view;
    expect(text(ssh.node.querySelector('.jc-link-kind'))).toBe(
      'ssh alice@head.example.org'
    );
    expect(ssh.node.querySelector('.jc-link-target')).toBeNull();
  });

  it('says since when and how often a link is reconnecting', () => {
    const { view } = show(linkView().view, [fx.hello, fx.linkReconnecting]);
    expect(text(view.node.querySelector('.jc-link-status'))).toBe(
      `reconnecting since ${formatClock(fx.T0)} (3 attempts; ` +
        'last: ConnectionRefusedError: [Errno 111] Connect call failed)'
    );
  });

  it('says why a link was lost', () => {
    const { view } = show(linkView().view, [fx.hello, fx.linkLost]);
    expect(text(view.node.querySelector('.jc-link-status'))).toBe(
      'lost: gave up after 600 s: the head does not answer'
    );
    expect(
      view.node.querySelector<HTMLButtonElement>('.jc-detach')?.disabled
    ).toBe(true);
  });

  it("disables Ray's dashboard on the embedded cluster, and says why", () => {
    const { view } = show(linkView().view);
    const button = view.node.querySelector<HTMLButtonElement>(
      '.jc-open-ray-dashboard'
    );
    expect(button?.disabled).toBe(true);
    expect(button?.title).toBe(
      "The embedded cluster runs without Ray's dashboard"
    );
  });

  it("opens Ray's forwarded dashboard", () => {
    const open = jest.spyOn(window, 'open').mockImplementation(() => null);
    const { view } = show(linkView().view, [fx.hello, fx.linkSsh]);
    const button = view.node.querySelector<HTMLButtonElement>(
      '.jc-open-ray-dashboard'
    );
    expect(button?.disabled).toBe(false);
    click(button);
    expect(open).toHaveBeenCalledWith(
      'http://127.0.0.1:41235',
      '_blank',
      'noopener'
    );
  });

  it('says when no dashboard is forwarded', () => {
    const { view } = show(linkView().view, [
      fx.hello,
      { type: 'link', link: { ...fx.linkSsh.link!, ray_dashboard: null } }
    ]);
    expect(
      view.node.querySelector<HTMLButtonElement>('.jc-open-ray-dashboard')
        ?.title
    ).toBe('No dashboard forwarded');
  });

  it('opens the dashboard pane through its callback', () => {
    const { view, openDashboard } = linkView();
    show(view);
    click(view.node.querySelector('.jc-open-dashboard'));
    expect(openDashboard).toHaveBeenCalledTimes(1);
  });

  it('detaches with a request and shows a refusal', async () => {
    const { view, comm } = show(linkView().view);
    click(view.node.querySelector('.jc-detach'));
    await flush();
    expect(comm.sent).toEqual([{ type: 'detach', request: 1 }]);
    reply(
      comm,
      false,
      'no cluster is attached: run `%cluster local` or `%cluster connect`'
    );
    await flush();
    const error = view.node.querySelector<HTMLElement>(
      '.jc-section > .jc-error'
    );
    expect(error?.hidden).toBe(false);
    expect(text(error)).toBe(
      'no cluster is attached: run `%cluster local` or `%cluster connect`'
    );
  });

  it('asks before Down when confirmDown is on, and sends nothing if cancelled', async () => {
    const { view, comm } = show(linkView(true).view);
    click(view.node.querySelector('.jc-down'));
    await flush();
    const dialog = document.body.querySelector('.jp-Dialog');
    expect(dialog).not.toBeNull();
    expect(text(dialog)).toContain(
      'This stops the embedded local cluster (/tmp/jupyter_cluster-0/agent.sock) ' +
        'and everything on it: 3 running cells, 2 actors and 1 training or sweep.'
    );
    expect(comm.sent).toEqual([]);
    click(dialog!.querySelector('.jp-mod-reject'));
    await flush();
    expect(document.body.querySelector('.jp-Dialog')).toBeNull();
    expect(comm.sent).toEqual([]);
  });

  it('sends down once the dialog is accepted', async () => {
    const { view, comm } = show(linkView(true).view);
    click(view.node.querySelector('.jc-down'));
    await flush();
    click(document.body.querySelector('.jp-Dialog .jp-mod-accept'));
    await flush();
    expect(comm.sent).toEqual([{ type: 'down', request: 1 }]);
  });

  it('sends down at once when confirmDown is off', async () => {
    const { view, comm } = show(linkView(false).view);
    click(view.node.querySelector('.jc-down'));
    await flush();
    expect(document.body.querySelector('.jp-Dialog')).toBeNull();
    expect(comm.sent).toEqual([{ type: 'down', request: 1 }]);
  });
});
