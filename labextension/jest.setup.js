// Warnings of JupyterLab's own packages under jsdom that say nothing about this code:
// no clipboard in jsdom, and @jupyter/ydoc making cells before adding them to a Y.Doc.
const harmless = [
  'Clipboard API not available',
  'Invalid access: Add Yjs type to a document before reading data',
  'Not same Y.Doc'
];
const warn = console.warn.bind(console);
console.warn = (...args) => {
  const text = args.map(String).join(' ');
  if (!harmless.some(known => text.includes(known))) {
    warn(...args);
  }
};
