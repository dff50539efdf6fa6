/**
 * What the sidebar shows before a cluster is attached: how to start one.
 */

import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { button, element } from './section';

/** The lines that start a cluster; the first is left out once the extension is loaded. */
export const START_LINES = ['%load_ext jupyter_cluster', '%cluster local'];

/** The source of the start cell, for a kernel where the extension is `loaded` or not. */
export function startSource(loaded: boolean): string {
  return (loaded ? START_LINES.slice(1) : START_LINES).join('\n');
}

/** Insert a code cell with the start lines above the notebook's active cell. */
export function insertStartCell(
  notebook: NotebookPanel,
  loaded: boolean
): void {
  const content = notebook.content;
  NotebookActions.insertAbove(content);
  NotebookActions.changeCellType(content, 'code');
  content.activeCell?.model.sharedModel.setSource(startSource(loaded));
}

/** Where the active notebook stands, as far as the start view cares. */
export interface IStartState {
  /** The active notebook's name, or null when there is none. */
  notebook: string | null;
  /** Whether the notebook has a kernel. */
  kernel: boolean;
  /** Whether `jupyter_cluster` is loaded in that kernel. */
  loaded: boolean;
}

/**
 * Explains how to start: `%load_ext jupyter_cluster`, then `%cluster local` (or
 * `%cluster connect user@head`), and offers to insert these lines into the notebook.
 */
export class StartView extends Widget {
  constructor(options: StartView.IOptions) {
    super();
    this.addClass('jc-start');
    this._insert = button('Insert these lines', 'jc-start-insert', () =>
      options.onInsert()
    );
    this._hint.textContent =
      'To attach to a cluster over SSH instead: %cluster connect user@head';
    this.node.append(this._text, this._code, this._insert, this._hint);
    this.setState({ notebook: null, kernel: false, loaded: false });
  }

  /** Say what to do for the notebook's state. */
  setState(state: IStartState): void {
    this._code.textContent = startSource(state.loaded);
    this._insert.disabled = state.notebook === null;
    this._insert.title =
      state.notebook === null
        ? 'Open a notebook first'
        : `Insert a cell with these lines into ${state.notebook}`;
    if (state.notebook === null) {
      this._text.textContent =
        'Open a notebook to see its Ray cluster here. To start one, run:';
    } else if (!state.kernel) {
      this._text.textContent = `${state.notebook} has no kernel yet. With a Python kernel, run:`;
    } else if (!state.loaded) {
      this._text.textContent = `Start a Ray cluster for ${state.notebook}:`;
    } else {
      this._text.textContent = `jupyter_cluster is loaded in ${state.notebook}, no cluster is attached. Start one:`;
    }
  }

  private _text = element('p', 'jc-start-text');
  private _code = element('pre', 'jc-start-code');
  private _hint = element('p', 'jc-start-hint');
  private _insert: HTMLButtonElement;
}

/** The options of a start view. */
export namespace StartView {
  export interface IOptions {
    /** Insert the start lines into the active notebook. */
    onInsert: () => void;
  }
}
