import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { ClusterPanel, DEFAULT_SETTINGS } from '../panel';
import { COMM_TARGET } from '../messages';
import { FakeComm, FakeKernel } from './fakes';
import * as fx from './fixtures';

/** A notebook panel as the sidebar sees it: a path, a title and a kernel. */
class FakeNotebook {
  constructor(
    path: string,
    public kernel: FakeKernel | null
  ) {
    this.context = { path };
    this.title = { label: path };
  }

  readonly context: { path: string };
  readonly title: { label: string };
  readonly node = document.createElement('div');
  readonly disposed = new Signal<this, void>(this);
  isDisposed = false;
  readonly sessionContext = {
    notebook: this,
    kernelChanged: new Signal<unknown, unknown>(this),
    get session() {
      const kernel = this.notebook.kernel;
      return kernel !== null ? { kernel: kernel.asKernel() } : null;
    }
  };

  changeKernel(kernel: FakeKernel | null): void {
    this.kernel = kernel;
    this.sessionContext.kernelChanged.emit({});
  }

  close(): void {
    this.isDisposed = true;
    this.disposed.emit();
  }
}

/** The notebook tracker's part the panel uses. */
class FakeTracker {
  readonly currentChanged = new Signal<this, FakeNotebook | null>(this);
  readonly widgetAdded = new Signal<this, FakeNotebook>(this);
  readonly notebooks: FakeNotebook[] = [];
  currentWidget: FakeNotebook | null = null;

  forEach(fn: (notebook: FakeNotebook) => void): void {
    this.notebooks.forEach(fn);
  }

  find(fn: (notebook: FakeNotebook) => boolean): FakeNotebook | undefined {
    return this.notebooks.find(fn);
  }

  open(notebook: FakeNotebook): FakeNotebook {
    this.notebooks.push(notebook);
    this.widgetAdded.emit(notebook);
    notebook.disposed.connect(() => {
      this.notebooks.splice(this.notebooks.indexOf(notebook), 1);
      if (this.currentWidget === notebook) {
        this.activate(null);
      }
    });
    return notebook;
  }

  activate(notebook: FakeNotebook | null): void {
    this.currentWidget = notebook;
    this.currentChanged.emit(notebook);
  }
}

function setup() {
  const tracker = new FakeTracker();
  const onInsertStartCell = jest.fn();
  const onOpenDashboard = jest.fn();
  const panel = new ClusterPanel({
    tracker: tracker as unknown as INotebookTracker,
    onInsertStartCell,
    onOpenDashboard
  });
  Widget.attach(panel, document.body);
  const q = <T extends HTMLElement = HTMLElement>(selector: string) =>
    panel.node.querySelector<T>(selector);
  const startShown = () => !q('.jc-start')!.classList.contains('lm-mod-hidden');
  const sectionsShown = () =>
    !q('.jc-sections')!.classList.contains('lm-mod-hidden');
  return {
    tracker,
    panel,
    q,
    startShown,
    sectionsShown,
    onInsertStartCell,
    onOpenDashboard
  };
}

/** The notebook's kernel opens the comm and tells an attached cluster. */
function attach(kernel: FakeKernel): FakeComm {
  const comm = kernel.openFromKernel(fx.hello);
  fx.session.slice(1).forEach(message => comm.receive(message));
  return comm;
}

afterEach(() => {
  document.body.replaceChildren();
});

describe('ClusterPanel', () => {
  it('shows the start view, with the button disabled, without a notebook', () => {
    const { q, startShown, sectionsShown } = setup();
    expect(startShown()).toBe(true);
    expect(sectionsShown()).toBe(false);
    expect(q<HTMLButtonElement>('.jc-start-insert')!.disabled).toBe(true);
    expect(q('.jc-start-text')!.textContent).toContain('Open a notebook');
  });

  it('shows the start view until the kernel attaches a cluster', () => {
    const { tracker, q, startShown, sectionsShown, onInsertStartCell } =
      setup();
    const kernel = new FakeKernel();
    tracker.activate(tracker.open(new FakeNotebook('demo.ipynb', kernel)));

    expect(startShown()).toBe(true);
    expect(q('.jc-start-text')!.textContent).toBe(
      'Start a Ray cluster for demo.ipynb:'
    );
    expect(q('.jc-start-code')!.textContent).toBe(
      '%load_ext jupyter_cluster\n%cluster local'
    );
    const insert = q<HTMLButtonElement>('.jc-start-insert')!;
    expect(insert.disabled).toBe(false);
    insert.click();
    expect(onInsertStartCell).toHaveBeenCalledTimes(1);

    // The visible panel asked the kernel once, telling it that it is visible.
    expect(kernel.comms).toHaveLength(1);
    expect(kernel.comms[0].opened).toEqual({
      type: 'watch',
      visible: true,
      interval: 1
    });
    kernel.comms[0].closeFromKernel();
    expect(startShown()).toBe(true);

    const comm = kernel.openFromKernel(fx.hello);
    comm.receive(fx.linkNone);
    expect(startShown()).toBe(true);
    expect(q('.jc-start-code')!.textContent).toBe('%cluster local');

    comm.receive(fx.linkConnected);
    expect(startShown()).toBe(false);
    expect(sectionsShown()).toBe(true);
    expect(q('.jc-link-status')!.textContent).toBe(
      'connected · 12 ms round trip'
    );

    kernel.setStatus('restarting');
    expect(startShown()).toBe(true);
  });

  it('follows the active notebook and keeps the others at hand', () => {
    const { tracker, q, sectionsShown } = setup();
    const first = new FakeKernel();
    const second = new FakeKernel();
    const a = tracker.open(new FakeNotebook('a.ipynb', first));
    const b = tracker.open(new FakeNotebook('b.ipynb', second));
    // Both kernels' targets are registered before their `%load_ext` runs.
    expect(first.targets.has(COMM_TARGET)).toBe(true);
    expect(second.targets.has(COMM_TARGET)).toBe(true);

    tracker.activate(a);
    expect(first.comms).toHaveLength(1); // the probe, before the kernel's own comm
    const comm = attach(first);
    comm.sent = [];
    expect(q('.jc-node')).not.toBeNull();

    tracker.activate(b);
    expect(sectionsShown()).toBe(false);
    expect(comm.sent).toEqual([{ type: 'watch', visible: false, interval: 1 }]);

    tracker.activate(a);
    expect(sectionsShown()).toBe(true);
    expect(q('.jc-node')).not.toBeNull();
    expect(first.comms).toHaveLength(1);
    expect(comm.sent.pop()).toEqual({
      type: 'watch',
      visible: true,
      interval: 1
    });
  });

  it('watches the nodes only while shown, at the interval of the settings', () => {
    const { tracker, panel } = setup();
    const kernel = new FakeKernel();
    tracker.activate(tracker.open(new FakeNotebook('demo.ipynb', kernel)));
    const comm = attach(kernel);
    comm.sent = [];
    panel.hide();
    panel.show();
    panel.settings = { ...DEFAULT_SETTINGS, refreshInterval: 0.5 };
    Widget.detach(panel);
    expect(comm.sent).toEqual([
      { type: 'watch', visible: false, interval: 1 },
      { type: 'watch', visible: true, interval: 1 },
      { type: 'watch', visible: true, interval: 0.5 },
      { type: 'watch', visible: false, interval: 0.5 }
    ]);
  });

  it('shows the sections the settings name', () => {
    const { tracker, panel, q } = setup();
    const kernel = new FakeKernel();
    tracker.activate(tracker.open(new FakeNotebook('demo.ipynb', kernel)));
    attach(kernel);
    panel.settings = { ...DEFAULT_SETTINGS, sections: ['nodes', 'cells'] };
    const shown = Array.from(panel.node.querySelectorAll('.jc-section'))
      .filter(node => !node.classList.contains('lm-mod-hidden'))
      .map(node => node.querySelector('.jc-section-title')!.textContent);
    expect(shown).toEqual(['Nodes', 'Cells']);
    expect(q('.jc-section-link')!.classList).toContain('lm-mod-hidden');
  });

  it('follows a kernel change and lets go of closed notebooks', () => {
    const { tracker, panel, startShown } = setup();
    const first = new FakeKernel();
    const notebook = tracker.open(new FakeNotebook('demo.ipynb', first));
    tracker.activate(notebook);
    attach(first);
    expect(startShown()).toBe(false);

    const second = new FakeKernel();
    notebook.changeKernel(second);
    expect(first.targets.has(COMM_TARGET)).toBe(false);
    expect(second.targets.has(COMM_TARGET)).toBe(true);
    expect(startShown()).toBe(true);
    expect(panel.current?.kernel).toBe(second.asKernel());

    notebook.close();
    expect(second.targets.has(COMM_TARGET)).toBe(false);
    expect(panel.current).toBeNull();
  });

  it('asks the notebook for its dashboard through the callback', () => {
    const { tracker, q, onOpenDashboard } = setup();
    const kernel = new FakeKernel();
    const notebook = tracker.open(new FakeNotebook('demo.ipynb', kernel));
    tracker.activate(notebook);
    attach(kernel);
    q('.jc-open-dashboard')!.click();
    expect(onOpenDashboard).toHaveBeenCalledWith(
      notebook as unknown as NotebookPanel
    );
  });
});
