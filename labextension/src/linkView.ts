/**
 * The notebook's link to its cluster: what and where it is, its state, and its buttons.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';

import { formatClock } from './format';
import { ILinkState } from './messages';
import { ClusterModel } from './model';
import { SectionView, button, element } from './section';

/** A sentence on the link's state: "connected · 12 ms round trip", "lost: ...". */
export function linkStateText(link: ILinkState): string {
  switch (link.state) {
    case 'connecting':
      return 'connecting…';
    case 'connected':
      return link.rtt !== null
        ? `connected · ${Math.round(link.rtt * 1000)} ms round trip`
        : 'connected';
    case 'reconnecting': {
      const since =
        link.since !== null ? ` since ${formatClock(link.since)}` : '';
      const attempts = `${link.attempts} attempt${link.attempts === 1 ? '' : 's'}`;
      const last = link.last_error ? `; last: ${link.last_error}` : '';
      return `reconnecting${since} (${attempts}${last})`;
    }
    case 'detached':
      return 'detached: `%cluster connect` resumes the session';
    case 'lost':
      return `lost: ${link.error ?? 'the link gave up'}`;
  }
}

/** What `down` stops, for its confirmation. */
export function downText(model: ClusterModel): string {
  const link = model.link;
  const what =
    link !== null ? `the ${link.kind} cluster (${link.target})` : 'the cluster';
  const cells = model.cells.filter(
    cell => cell.status === 'queued' || cell.status === 'running'
  ).length;
  const runs = model.runs.filter(
    run => run.status === 'starting' || run.status === 'running'
  ).length;
  return (
    `This stops ${what} and everything on it: ${plural(cells, 'running cell')}, ` +
    `${plural(model.actors.length, 'actor')} and ${plural(runs, 'training or sweep', 'trainings or sweeps')}. ` +
    'Their results and the actors’ state are lost.'
  );
}

function plural(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

/**
 * The link's line: state badge, kind and target, the state in words, session and versions;
 * buttons open the dashboards, detach, or stop the cluster (asking first if the settings
 * say so).
 */
export class LinkView extends SectionView {
  constructor(options: LinkView.IOptions) {
    super('link', 'Cluster', ['hello', 'link']);
    this._options = options;
  }

  protected render(model: ClusterModel): void {
    const link = model.link;
    if (link === null) {
      this.body.replaceChildren();
      return;
    }
    const head = element('div', 'jc-row-main');
    const kind = element('span', 'jc-link-kind', link.kind);
    kind.title = link.kind;
    head.append(
      element(
        'span',
        `jc-badge jc-link-state jc-state-${link.state}`,
        link.state
      ),
      kind
    );
    const parts: HTMLElement[] = [head];
    if (!link.kind.includes(link.target)) {
      const target = element(
        'div',
        'jc-row-detail jc-link-target',
        link.target
      );
      target.title = link.target;
      parts.push(target);
    }
    const status = element(
      'div',
      'jc-row-detail jc-link-status',
      linkStateText(link)
    );
    const about = element(
      'div',
      'jc-row-detail jc-muted',
      `session ${link.session} · Ray ${link.ray} · Python ${link.python}`
    );
    parts.push(status, about);
    if (model.mismatch !== null) {
      parts.push(element('div', 'jc-error', model.mismatch));
    }
    parts.push(this._buttons(link));
    this.body.replaceChildren(...parts);
  }

  private _buttons(link: ILinkState): HTMLElement {
    const row = element('div', 'jc-buttons');
    const dashboard = button(
      'Dashboard',
      'jc-open-dashboard',
      () => this._options.openDashboard(),
      'Open the live dashboard of this cluster in a tab'
    );
    const rayDashboard = button(
      'Ray dashboard',
      'jc-open-ray-dashboard',
      () => {
        if (link.ray_dashboard !== null) {
          window.open(link.ray_dashboard, '_blank', 'noopener');
        }
      },
      link.ray_dashboard !== null
        ? `Open Ray's dashboard (${link.ray_dashboard})`
        : link.kind.startsWith('embedded')
          ? "The embedded cluster runs without Ray's dashboard"
          : 'No dashboard forwarded'
    );
    rayDashboard.disabled = link.ray_dashboard === null;
    const detach = button(
      'Detach',
      'jc-detach',
      () => void this.run({ type: 'detach' }),
      'Detach the notebook; the cluster and its work keep running'
    );
    detach.disabled = link.state === 'detached' || link.state === 'lost';
    const down = button(
      'Down',
      'jc-down jc-button-warn',
      () => void this._down(),
      'Stop the cluster and everything running on it'
    );
    row.append(dashboard, rayDashboard, detach, down);
    return row;
  }

  private async _down(): Promise<void> {
    const connection = this.connection;
    if (connection === null) {
      return;
    }
    if (this._options.confirmDown()) {
      const result = await showDialog({
        title: 'Stop the cluster?',
        body: downText(connection.model),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: 'Stop the cluster' })
        ]
      });
      if (!result.button.accept) {
        return;
      }
    }
    this.showError(null);
    await this.run({ type: 'down' });
  }

  private _options: LinkView.IOptions;
}

/** The options of a link view. */
export namespace LinkView {
  export interface IOptions {
    /** Open the notebook's dashboard pane. */
    openDashboard: () => void;
    /** Whether "Down" asks first (the `confirmDown` setting). */
    confirmDown: () => boolean;
  }
}
