/**
 * The SSH port forwards of the link: what on the cluster each reaches, and where here.
 */

import { IForwardState } from './messages';
import { ClusterModel } from './model';
import { SectionView, element, emptyLine } from './section';

/** One row per forward: its name, its local URL as a link, and what it reaches. */
export class ForwardsView extends SectionView {
  constructor() {
    super('forwards', 'Port forwards', ['forwards']);
  }

  protected render(model: ClusterModel): void {
    const rows = model.forwards.map(forward => forwardRow(forward));
    this.body.replaceChildren(
      ...(rows.length > 0 ? rows : [emptyLine('No port forwards.')])
    );
  }
}

function forwardRow(forward: IForwardState): HTMLElement {
  const row = element('div', 'jc-forward');
  const link = element('a', 'jc-forward-link', forward.local);
  link.href = forward.local;
  link.target = '_blank';
  link.rel = 'noopener noreferrer';
  const main = element('div', 'jc-row-main');
  main.append(element('span', 'jc-forward-name', forward.name), link);
  row.append(main, element('div', 'jc-row-detail', `→ ${forward.remote}`));
  return row;
}
