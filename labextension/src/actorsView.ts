/**
 * The cluster's named actors: where each lives and which cell it runs, with a kill button.
 */

import { IActorState } from './messages';
import { ClusterModel } from './model';
import { SectionView, button, element, emptyLine } from './section';

/**
 * One row per actor: its name, node and the cell it runs now; "Kill" asks the kernel to
 * kill it, and a refusal shows in the row.
 */
export class ActorsView extends SectionView {
  constructor() {
    super('actors', 'Actors', ['actors', 'cells']);
  }

  protected render(model: ClusterModel): void {
    const listed = new Set(model.actors.map(actor => actor.name));
    for (const name of [...this._errors.keys()]) {
      if (!listed.has(name)) {
        this._errors.delete(name);
      }
    }
    const rows = model.actors.map(actor => this._row(actor, model));
    this.body.replaceChildren(
      ...(rows.length > 0
        ? rows
        : [emptyLine('No actors: `%%remote --actor NAME` makes one.')])
    );
  }

  private _row(actor: IActorState, model: ClusterModel): HTMLElement {
    const row = element('div', 'jc-actor');
    row.dataset.actor = actor.name;
    row.classList.toggle('jc-actor-broken', actor.error !== null);
    const main = element('div', 'jc-row-main');
    const kill = button(
      'Kill',
      'jc-kill',
      () => void this._kill(actor.name, kill),
      `Kill actor ${actor.name} (its state is lost)`
    );
    main.append(element('span', 'jc-actor-name', actor.name), kill);
    // A busy actor is not asked where it runs (it would answer after its cell): its cell says enough.
    const detail: string[] = actor.node !== null ? [actor.node] : [];
    if (actor.running !== null) {
      const cell = model.cell(actor.running);
      detail.push(`running ${cell?.label ?? actor.running}`);
    } else {
      detail.push(actor.node !== null ? 'idle' : 'not placed yet');
    }
    row.append(main, element('div', 'jc-row-detail', detail.join(' · ')));
    if (actor.error !== null) {
      row.append(element('div', 'jc-row-detail jc-muted', actor.error));
    }
    const error = this._errors.get(actor.name);
    if (error !== undefined) {
      row.append(element('div', 'jc-error', error));
    }
    return row;
  }

  private async _kill(name: string, kill: HTMLButtonElement): Promise<void> {
    kill.disabled = true;
    this._errors.delete(name);
    let failure: string | null = null;
    await this.run({ type: 'kill_actor', name }, message => {
      failure = message;
    });
    if (failure !== null) {
      this._errors.set(name, failure);
      this.refresh();
    }
  }

  private _errors = new Map<string, string>();
}
