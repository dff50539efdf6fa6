/**
 * The notebook's remote cells: the running ones, then the most recent finished ones.
 */

import { formatDuration, formatTook } from './format';
import { ICellState } from './messages';
import { ClusterModel } from './model';
import { SectionView, button, element, emptyLine } from './section';

/** A cell that has not ended. */
function isActive(cell: ICellState): boolean {
  return cell.status === 'queued' || cell.status === 'running';
}

/**
 * One row per cell: status, label, map progress, elapsed time, where it runs, and a
 * cancel button while it is queued or running.
 *
 * The elapsed time of running cells is ticked by a browser timer, which runs only while
 * such a cell is listed and the panel is visible: the clock costs no kernel traffic.
 */
export class CellsView extends SectionView {
  constructor() {
    super('cells', 'Cells', ['cells']);
  }

  protected render(model: ClusterModel): void {
    const listed = new Set(model.cells.map(cell => cell.id));
    for (const id of [...this._errors.keys()]) {
      if (!listed.has(id)) {
        this._errors.delete(id);
      }
    }
    this._clocks = [];
    const rows = model.cells.map(cell => this._row(cell));
    this.body.replaceChildren(
      ...(rows.length > 0
        ? rows
        : [emptyLine('No remote cells yet: run a %%remote cell.')])
    );
    this._setTicking();
  }

  private _row(cell: ICellState): HTMLElement {
    const row = element('div', `jc-cell jc-status-${cell.status}`);
    row.dataset.cellId = cell.id;
    const main = element('div', 'jc-row-main');
    main.append(
      element('span', 'jc-badge', cell.status),
      element('span', 'jc-cell-label', cell.label)
    );
    if (cell.progress !== null) {
      const [done, all] = cell.progress;
      const tasks = cell.tasks_running;
      const running =
        isActive(cell) && tasks !== undefined && tasks !== null
          ? ` · ${tasks} task${tasks === 1 ? '' : 's'}`
          : '';
      main.append(
        element('span', 'jc-progress', `${done}/${all} items${running}`)
      );
    }
    const elapsed = element('span', 'jc-elapsed');
    main.append(elapsed);
    if (isActive(cell)) {
      this._clocks.push({ node: elapsed, since: cell.submitted });
      elapsed.textContent = formatDuration(now() - cell.submitted);
      const cancel = button(
        '✕',
        'jc-cancel',
        () => void this._cancel(cell, cancel),
        'Cancel this cell'
      );
      main.append(cancel);
    } else {
      elapsed.textContent = formatTook(
        (cell.finished ?? cell.submitted) - cell.submitted
      );
    }
    const detail = [cell.where];
    if (cell.node !== null) {
      detail.push(cell.node);
    }
    if (cell.foreground && isActive(cell)) {
      detail.push('the notebook waits on it');
    }
    row.append(main, element('div', 'jc-row-detail', detail.join(' · ')));
    const error = this._errors.get(cell.id);
    if (error !== undefined) {
      row.append(element('div', 'jc-error', error));
    }
    return row;
  }

  /**
   * Cancel a cell. The kernel reads the comm only between cells, so a cell the notebook
   * waits on is cancelled by interrupting the kernel instead.
   */
  private async _cancel(
    cell: ICellState,
    cancel: HTMLButtonElement
  ): Promise<void> {
    const connection = this.connection;
    if (connection === null) {
      return;
    }
    cancel.disabled = true;
    this._errors.delete(cell.id);
    let failure: string | null = null;
    if (cell.foreground) {
      try {
        await connection.interrupt();
      } catch (error) {
        failure = `Could not interrupt the kernel: ${(error as Error).message}`;
      }
    } else {
      await this.run({ type: 'cancel', cell: cell.id }, message => {
        failure = message;
      });
    }
    if (failure !== null) {
      this._errors.set(cell.id, failure);
      this.refresh();
    }
  }

  private _setTicking(): void {
    this.setClock(this._clocks.length > 0 ? () => this._tickClocks() : null);
  }

  private _tickClocks(): void {
    const t = now();
    for (const clock of this._clocks) {
      clock.node.textContent = formatDuration(t - clock.since);
    }
  }

  private _clocks: { node: HTMLElement; since: number }[] = [];
  private _errors = new Map<string, string>();
}

/** The browser's time, in seconds since the epoch (the kernel's unit). */
function now(): number {
  return Date.now() / 1000;
}
