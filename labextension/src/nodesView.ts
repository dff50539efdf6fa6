/**
 * The cluster's nodes, one row each, with bars for CPU, GPU, RAM and object store.
 */

import { formatBytes, formatDuration, formatNumber, percent } from './format';
import { IBar, INodeState } from './messages';
import { ClusterModel } from './model';
import { SectionView, element, emptyLine } from './section';

/** A bar fills up in this warning colour from this share on (percent). */
const HIGH = 90;

/** Figures older than this (seconds) are greyed, with their age: the kernel samples once a second. */
export const STALE_AFTER = 2;

/**
 * One row per node: its address ("head" marked), then four bars. A node that left the
 * cluster stays greyed out. The kernel sends the nodes only while the panel is visible.
 */
export class NodesView extends SectionView {
  constructor() {
    super('nodes', 'Nodes', ['nodes']);
  }

  protected render(model: ClusterModel): void {
    const rows = model.nodes.map(node => nodeRow(node));
    this._age.className = 'jc-nodes-age';
    this._sampled = rows.length > 0 ? model.nodesTime : null;
    // The rest of the cluster's work, counted apart: the sections below list this notebook's own.
    const others = element('div', 'jc-nodes-others', model.others);
    others.title =
      "The cluster's other Ray jobs: other notebooks' cells and what their code started, scripts, " +
      'submitted jobs. Not listed here: they are theirs.';
    others.hidden = !model.others;
    this.body.replaceChildren(
      ...(rows.length > 0
        ? [...rows, others, this._age]
        : [emptyLine('Waiting for the nodes…')])
    );
    this.showAge();
    this._setTicking();
  }

  /**
   * Grey the bars, and say how old they are, once their figures are older than
   * STALE_AFTER seconds (the link is down, the kernel is busy): a number on screen is
   * either current or says its age.
   */
  showAge(at: number = Date.now() / 1000): void {
    const age = this._sampled === null ? 0 : at - this._sampled;
    const stale = age > STALE_AFTER;
    this.body.classList.toggle('jc-nodes-stale', stale);
    this._age.hidden = !stale;
    this._age.textContent = stale ? `as of ${formatDuration(age)} ago` : '';
  }

  private _setTicking(): void {
    this.setClock(this._sampled !== null ? () => this.showAge() : null);
  }

  private _age = document.createElement('div');
  private _sampled: number | null = null;
}

function nodeRow(node: INodeState): HTMLElement {
  const row = element('div', 'jc-node');
  row.dataset.nodeId = node.id;
  row.classList.toggle('jc-node-dead', !node.alive);
  if (!node.alive) {
    row.title = 'This node left the cluster';
  }
  const name = element('div', 'jc-node-name');
  name.append(element('span', 'jc-node-address', node.address));
  if (node.head) {
    name.append(element('span', 'jc-tag', 'head'));
  }
  row.append(name);
  const cpu = node.cpu;
  row.append(
    bar(
      'cpu',
      cpu,
      `${formatNumber(cpu.used)}/${formatNumber(cpu.total)} CPU`,
      "CPUs held by the cluster's running tasks and actors (Ray's logical CPUs)"
    )
  );
  if (node.gpu !== null) {
    const gram = node.gram;
    const memory =
      gram !== null
        ? `; GPU memory ${formatBytes(gram.used)} of ${formatBytes(gram.total)}`
        : '';
    row.append(
      bar(
        'gpu',
        node.gpu,
        `${formatNumber(node.gpu.used)}/${formatNumber(node.gpu.total)} GPU`,
        `GPUs in use${memory}`
      )
    );
  }
  row.append(
    bar('ram', node.ram, `${bytes(node.ram)} RAM`, 'Memory in use'),
    bar(
      'store',
      node.store,
      `${bytes(node.store)} store`,
      'Object store in use'
    )
  );
  return row;
}

function bytes(value: IBar): string {
  return `${formatBytes(value.used)} / ${formatBytes(value.total)}`;
}

function bar(
  resource: string,
  value: IBar,
  text: string,
  what: string
): HTMLElement {
  const share = percent(value.used, value.total);
  const node = element('div', 'jc-bar');
  node.dataset.resource = resource;
  node.classList.toggle('jc-bar-high', share >= HIGH);
  node.title = `${what}: ${Math.round(share)}%`;
  const fill = element('div', 'jc-bar-fill');
  fill.style.width = `${formatNumber(share)}%`;
  node.append(fill, element('span', 'jc-bar-text', text));
  return node;
}
