/**
 * The extension's commands, and the dashboard buttons in notebook outputs.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { NOT_LOADED } from './connection';
import { openDashboard } from './dashboardPane';
import { clusterIcon } from './icon';
import { ClusterPanel } from './panel';
import { insertStartCell } from './startView';

export namespace CommandIDs {
  export const openDashboard = 'jupyter-cluster:open-dashboard';
  export const insertStartCell = 'jupyter-cluster:insert-start-cell';
}

/** The attribute of the kernel's "Open dashboard" button (`Cluster._repr_html_`). */
export const DASHBOARD_ATTRIBUTE = 'data-jupyter-cluster-dashboard';

const CATEGORY = 'Ray cluster';

/**
 * Add the commands, put them in the palette (if any), and make the buttons carrying
 * `data-jupyter-cluster-dashboard` in a notebook's outputs open that notebook's dashboard.
 */
export function addCommands(
  app: JupyterFrontEnd,
  panel: ClusterPanel,
  tracker: INotebookTracker,
  palette: ICommandPalette | null
): void {
  const { commands } = app;

  commands.addCommand(CommandIDs.openDashboard, {
    label: 'Open the Ray Cluster Dashboard',
    caption: "Open a live dashboard of the notebook's Ray cluster in a tab",
    icon: clusterIcon,
    describedBy: {
      args: {
        type: 'object',
        properties: {
          path: {
            type: 'string',
            description:
              'The notebook whose cluster to show (default: the current one)'
          }
        }
      }
    },
    execute: async args => {
      const path = typeof args.path === 'string' ? args.path : null;
      const notebook =
        path !== null
          ? (tracker.find(n => n.context.path === path) ?? null)
          : tracker.currentWidget;
      if (notebook === null) {
        return;
      }
      try {
        await showDashboard(app, panel, notebook);
      } catch (error) {
        await showErrorMessage('Ray cluster dashboard', error as Error);
      }
    }
  });

  commands.addCommand(CommandIDs.insertStartCell, {
    label: 'Insert the Lines That Start a Ray Cluster',
    caption:
      'Insert `%load_ext jupyter_cluster` and `%cluster local` above the active cell',
    isEnabled: () => tracker.currentWidget !== null,
    execute: () => {
      const notebook = tracker.currentWidget;
      if (notebook !== null) {
        const loaded = panel.connectionFor(notebook)?.model.loaded ?? false;
        insertStartCell(notebook, loaded);
      }
    }
  });

  if (palette !== null) {
    for (const command of [
      CommandIDs.openDashboard,
      CommandIDs.insertStartCell
    ]) {
      palette.addItem({ command, category: CATEGORY });
    }
  }

  document.body.addEventListener('click', event => {
    const target = event.target;
    if (!(target instanceof Element)) {
      return;
    }
    const button = target.closest(`[${DASHBOARD_ATTRIBUTE}]`);
    const notebook =
      button !== null ? tracker.find(n => n.node.contains(button)) : undefined;
    if (notebook !== undefined) {
      event.preventDefault();
      void commands.execute(CommandIDs.openDashboard, {
        path: notebook.context.path
      });
    }
  });
}

/** Ask the notebook's kernel for a dashboard and show it. */
async function showDashboard(
  app: JupyterFrontEnd,
  panel: ClusterPanel,
  notebook: NotebookPanel
): Promise<void> {
  await notebook.sessionContext.ready;
  const connection = panel.connectionFor(notebook);
  if (connection === null) {
    throw new Error(NOT_LOADED);
  }
  const reply = await connection.request({ type: 'dashboard' });
  if (!reply.ok) {
    throw new Error(reply.message);
  }
  openDashboard(app.shell, notebook, reply.outputs ?? []);
}
