/**
 * The sidebar: follows the active notebook's kernel and shows its cluster.
 */

import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISessionContext } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Kernel } from '@jupyterlab/services';
import { Message } from '@lumino/messaging';
import { Panel } from '@lumino/widgets';

import { ActorsView } from './actorsView';
import { CellsView } from './cellsView';
import { KernelConnection } from './connection';
import { ForwardsView } from './forwardsView';
import { LinkView } from './linkView';
import { ClusterModel, ClusterPart } from './model';
import { NodesView } from './nodesView';
import { RunsView } from './runsView';
import { SectionName, SectionView } from './section';
import { StartView } from './startView';

/** The sidebar's settings (schema/plugin.json). */
export interface IPanelSettings {
  /** The sections shown, in the panel's order. */
  sections: SectionName[];
  /** Seconds between node-bar updates. */
  refreshInterval: number;
  /** Whether "Down" asks first. */
  confirmDown: boolean;
}

export const DEFAULT_SETTINGS: IPanelSettings = {
  sections: ['link', 'nodes', 'cells', 'actors', 'runs', 'forwards'],
  refreshInterval: 1,
  confirmDown: true
};

/** The panel's settings from the registry's (already validated) composite. */
export function readSettings(
  settings: ISettingRegistry.ISettings
): IPanelSettings {
  const composite = settings.composite as Partial<IPanelSettings>;
  return { ...DEFAULT_SETTINGS, ...composite };
}

/**
 * The sidebar panel: a start view, or the sections of the active notebook's cluster.
 *
 * It keeps one connection per kernel of the open notebooks, so that each kernel's comm
 * target is registered before its `%load_ext` runs and switching back to a notebook
 * shows its state at once; a connection goes when no open notebook uses its kernel.
 * The kernel samples the nodes only while the panel says it is visible.
 */
export class ClusterPanel extends Panel {
  constructor(options: ClusterPanel.IOptions) {
    super();
    this.addClass('jc-ClusterPanel');
    this._tracker = options.tracker;
    this._start = new StartView({ onInsert: options.onInsertStartCell });
    this._views = [
      new LinkView({
        openDashboard: () => {
          const notebook = this._tracker.currentWidget;
          if (notebook !== null) {
            options.onOpenDashboard(notebook);
          }
        },
        confirmDown: () => this._settings.confirmDown
      }),
      new NodesView(),
      new CellsView(),
      new ActorsView(),
      new RunsView(),
      new ForwardsView()
    ];
    this._sections.addClass('jc-sections');
    for (const view of this._views) {
      this._sections.addWidget(view);
    }
    this.addWidget(this._start);
    this.addWidget(this._sections);
    this._tracker.forEach(notebook => this._follow(notebook));
    this._tracker.widgetAdded.connect(
      (_, notebook) => this._follow(notebook),
      this
    );
    this._tracker.currentChanged.connect(this._show, this);
    this._show();
  }

  /** The connection of the active notebook's kernel, or null. */
  get current(): KernelConnection | null {
    return this._current;
  }

  get settings(): IPanelSettings {
    return this._settings;
  }

  set settings(settings: IPanelSettings) {
    this._settings = settings;
    for (const view of this._views) {
      view.setHidden(!settings.sections.includes(view.name));
    }
    this._watch(this.isVisible);
  }

  /** The connection to a notebook's kernel (made if needed), or null without a kernel. */
  connectionFor(notebook: NotebookPanel): KernelConnection | null {
    const kernel = notebook.sessionContext.session?.kernel ?? null;
    if (kernel === null || kernel.isDisposed) {
      return null;
    }
    let connection = this._connections.get(kernel);
    if (connection === undefined || connection.isDisposed) {
      connection = new KernelConnection(kernel);
      this._connections.set(kernel, connection);
    }
    return connection;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._connections.forEach(connection => connection.dispose());
    this._connections.clear();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._show();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._watch(false);
  }

  protected onBeforeDetach(msg: Message): void {
    this._watch(false);
    super.onBeforeDetach(msg);
  }

  /** Keep a connection to this notebook's kernel, whichever it is. */
  private _follow(notebook: NotebookPanel): void {
    const context = notebook.sessionContext;
    context.kernelChanged.connect(this._onKernelChanged, this);
    notebook.disposed.connect(() => {
      context.kernelChanged.disconnect(this._onKernelChanged, this);
      this._prune(notebook);
      this._show();
    });
    this.connectionFor(notebook);
  }

  private _onKernelChanged(context: ISessionContext): void {
    const notebook = this._tracker.find(n => n.sessionContext === context);
    if (notebook !== undefined) {
      this.connectionFor(notebook);
    }
    this._prune();
    this._show();
  }

  /** Drop the connections no open notebook needs (`closing` is on its way out). */
  private _prune(closing?: NotebookPanel): void {
    const used = new Set<Kernel.IKernelConnection>();
    this._tracker.forEach(notebook => {
      const kernel = notebook.sessionContext.session?.kernel;
      if (notebook !== closing && !notebook.isDisposed && kernel) {
        used.add(kernel);
      }
    });
    for (const [kernel, connection] of [...this._connections]) {
      if (!used.has(kernel) || connection.isDisposed) {
        connection.dispose();
        this._connections.delete(kernel);
      }
    }
  }

  /** Show the active notebook's connection. */
  private _show(): void {
    const notebook = this._tracker.currentWidget;
    const connection =
      notebook !== null && !notebook.isDisposed
        ? this.connectionFor(notebook)
        : null;
    if (connection !== this._current) {
      const previous = this._current;
      if (previous !== null) {
        previous.model.changed.disconnect(this._onModelChanged, this);
        if (!previous.isDisposed) {
          previous.watch(false, this._settings.refreshInterval);
        }
      }
      this._current = connection;
      connection?.model.changed.connect(this._onModelChanged, this);
      for (const view of this._views) {
        view.connection = connection;
      }
    }
    this._watch(this.isVisible);
    if (connection !== null && this.isVisible) {
      void connection.probe();
    }
    this._updateMode();
  }

  private _onModelChanged(model: ClusterModel, part: ClusterPart): void {
    if (part === 'hello' || part === 'link' || part === 'all') {
      this._updateMode();
    }
  }

  /** The start view until a cluster is attached, then the sections. */
  private _updateMode(): void {
    const notebook = this._tracker.currentWidget;
    const model = this._current?.model ?? null;
    const attached = model?.attached ?? false;
    this._start.setHidden(attached);
    this._sections.setHidden(!attached);
    this._start.setState({
      notebook: notebook !== null ? notebook.title.label : null,
      kernel: this._current !== null,
      loaded: model?.loaded ?? false
    });
  }

  private _watch(visible: boolean): void {
    const connection = this._current;
    if (connection !== null && !connection.isDisposed) {
      connection.watch(visible, this._settings.refreshInterval);
    }
  }

  private _tracker: INotebookTracker;
  private _start: StartView;
  private _sections = new Panel();
  private _views: SectionView[];
  private _connections = new Map<Kernel.IKernelConnection, KernelConnection>();
  private _current: KernelConnection | null = null;
  private _settings: IPanelSettings = DEFAULT_SETTINGS;
}

/** The options of the cluster panel. */
export namespace ClusterPanel {
  export interface IOptions {
    /** The notebooks to follow. */
    tracker: INotebookTracker;
    /** Open the dashboard pane of a notebook's cluster. */
    onOpenDashboard: (notebook: NotebookPanel) => void;
    /** Insert the start lines into the active notebook. */
    onInsertStartCell: () => void;
  }
}
