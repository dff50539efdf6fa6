/**
 * The JupyterLab sidebar of jupyter_cluster: the active notebook's Ray cluster.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { CommandIDs, addCommands } from './commands';
import { clusterIcon } from './icon';
import { ClusterPanel, readSettings } from './panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-cluster-labextension:plugin',
  description:
    "A sidebar that shows the active notebook's Ray cluster (jupyter_cluster).",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, ICommandPalette],
  activate
};

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  settingRegistry: ISettingRegistry | null,
  palette: ICommandPalette | null
): void {
  const panel = new ClusterPanel({
    tracker,
    onOpenDashboard: notebook =>
      void app.commands.execute(CommandIDs.openDashboard, {
        path: notebook.context.path
      }),
    onInsertStartCell: () =>
      void app.commands.execute(CommandIDs.insertStartCell)
  });
  panel.id = 'jupyter-cluster-sidebar';
  panel.title.icon = clusterIcon;
  panel.title.caption = 'Ray cluster';
  app.shell.add(panel, 'left', { rank: 200 });

  addCommands(app, panel, tracker, palette);

  if (settingRegistry !== null) {
    settingRegistry
      .load(plugin.id)
      .then(settings => {
        panel.settings = readSettings(settings);
        settings.changed.connect(() => {
          panel.settings = readSettings(settings);
        });
      })
      .catch(reason => {
        console.error('jupyter_cluster: could not load the settings', reason);
      });
  }
}

export default plugin;
