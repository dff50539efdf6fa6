/**
 * The cluster's live dashboard in a main-area tab.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import * as nbformat from '@jupyterlab/nbformat';
import { NotebookPanel } from '@jupyterlab/notebook';
import { OutputArea, OutputAreaModel } from '@jupyterlab/outputarea';

import { clusterIcon } from './icon';
import { IOutput } from './messages';

/** The open panes, by notebook: asking again refreshes and shows the same tab. */
const panes = new WeakMap<NotebookPanel, MainAreaWidget<OutputArea>>();

/**
 * Show the kernel's dashboard outputs (BokehJS, then the widget's view) in a tab.
 *
 * They render with the notebook's own rendermime, which holds that notebook's ipywidgets
 * manager: the widget lives in the notebook's kernel. Closing the tab leaves it there.
 */
export function openDashboard(
  shell: JupyterFrontEnd.IShell,
  notebook: NotebookPanel,
  outputs: IOutput[]
): MainAreaWidget<OutputArea> {
  let pane = panes.get(notebook);
  if (pane === undefined || pane.isDisposed) {
    const model = new OutputAreaModel({ trusted: true });
    const area = new OutputArea({
      model,
      rendermime: notebook.content.rendermime
    });
    area.addClass('jc-dashboard');
    pane = new MainAreaWidget({ content: area });
    pane.id = `jupyter-cluster-dashboard-${notebook.id}`;
    pane.title.icon = clusterIcon;
    pane.title.closable = true;
    pane.disposed.connect(() => model.dispose());
    panes.set(notebook, pane);
    shell.add(pane, 'main', { mode: 'split-right', ref: notebook.id });
  }
  pane.title.label = `Ray cluster dashboard — ${notebook.title.label}`;
  const model = pane.content.model;
  model.clear();
  for (const output of outputs) {
    model.add(output as unknown as nbformat.IOutput);
  }
  shell.activateById(pane.id);
  return pane;
}
