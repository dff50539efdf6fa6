import { Notebook, NotebookModel, NotebookPanel } from '@jupyterlab/notebook';
import { NBTestUtils } from '@jupyterlab/notebook/lib/testutils';

import { START_LINES, insertStartCell, startSource } from '../startView';

describe('insertStartCell', () => {
  let notebook: Notebook;
  /** The notebook in a panel, as far as the insertion goes. */
  let panel: NotebookPanel;

  beforeEach(() => {
    notebook = NBTestUtils.createNotebook();
    const model = new NotebookModel();
    model.sharedModel.insertCells(0, [
      { cell_type: 'markdown', source: '# Demo' },
      { cell_type: 'code', source: 'import numpy as np' },
      { cell_type: 'code', source: 'x = np.arange(10)' }
    ]);
    notebook.model = model;
    notebook.activeCellIndex = 2;
    panel = { content: notebook } as NotebookPanel;
  });

  afterEach(() => {
    notebook.dispose();
  });

  it('inserts a code cell with the two lines above the active cell', () => {
    const before = panel.content.widgets.length;
    const below = panel.content.widgets[2].model.sharedModel.getSource();
    insertStartCell(panel, false);
    const cells = panel.content.widgets;
    expect(cells).toHaveLength(before + 1);
    expect(cells[2].model.type).toBe('code');
    expect(cells[2].model.sharedModel.getSource()).toBe(
      '%load_ext jupyter_cluster\n%cluster local'
    );
    expect(cells[3].model.sharedModel.getSource()).toBe(below);
  });

  it('leaves %load_ext out when the extension is loaded', () => {
    insertStartCell(panel, true);
    expect(panel.content.widgets[2].model.sharedModel.getSource()).toBe(
      '%cluster local'
    );
  });
});

describe('startSource', () => {
  it('is the start lines', () => {
    expect(startSource(false).split('\n')).toEqual(START_LINES);
    expect(startSource(true)).toBe(START_LINES[1]);
  });
});
