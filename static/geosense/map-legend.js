// The map's legend: one row per class of the whole dataset (counts from the server's tile
// JSON, not from what is loaded), with its colour and a toggle. Class names are data: they
// live in Maps (never object keys) and go into the page as text inside <bdi>, so a
// right-to-left override in a name cannot reorder the count after it.

/**
 * The legend rows, sorted by class name.
 *
 * @param {Map<string, number>} counts
 * @param {Map<string, string>} colors
 * @param {Set<string>} hidden
 * @returns {{name: string, count: number, color: string, visible: boolean}[]}
 */
export function legendModel(counts, colors, hidden) {
  return [...counts]
    .map(([name, count]) => ({ name, count, color: colors.get(name), visible: !hidden.has(name) }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** `{class: n}` of the tile JSON as a Map of whole numbers (anything else is dropped). */
export function countsOf(raw) {
  const counts = new Map();
  if (!raw || typeof raw !== 'object') return counts;
  for (const [name, count] of Object.entries(raw)) {
    if (Number.isSafeInteger(count) && count >= 0) counts.set(name, count);
  }
  return counts;
}

const COUNT_FORMAT = new Intl.NumberFormat('en-US');

/**
 * Draws the legend rows into `box` (replacing what was there): a checkbox (data-class) that
 * calls `onToggle(name, checked)`, the colour swatch, the name in <bdi> and the count.
 *
 * @param {HTMLElement} box
 * @param {ReturnType<typeof legendModel>} rows
 * @param {(name: string, visible: boolean) => void} onToggle
 */
export function renderLegend(box, rows, onToggle) {
  const document = box.ownerDocument;
  box = box.querySelector('.map-legend-rows') || box;
  box.replaceChildren();
  for (const row of rows) {
    const label = document.createElement('label');
    label.className = 'map-legend-row';
    const checkbox = document.createElement('input');
    checkbox.type = 'checkbox';
    checkbox.className = 'map-legend-toggle';
    checkbox.checked = row.visible;
    checkbox.setAttribute('data-class', row.name);
    checkbox.addEventListener('change', () => onToggle(row.name, checkbox.checked));
    const swatch = document.createElement('span');
    swatch.className = 'map-legend-swatch';
    swatch.style.background = row.color;
    const text = document.createElement('span');
    text.className = 'map-legend-label';
    const name = document.createElement('bdi');
    name.textContent = row.name;
    const count = document.createElement('span');
    count.className = 'map-legend-count';
    count.setAttribute('data-count', String(row.count));
    count.textContent = ` (${COUNT_FORMAT.format(row.count)})`;
    text.append(name, count);
    label.append(checkbox, swatch, text);
    box.appendChild(label);
  }
}

/** On a phone (narrow, or held sideways: short) the legend starts folded: open, it would
 * cover much of the map. */
export const LEGEND_FOLDED_QUERY = '(max-width: 700px), (max-height: 500px)';

/**
 * The legend's box: a labelled group that keeps its clicks and wheel away from the map, and
 * folds to its "Legend" summary (open on wide screens, folded on narrow ones, as the reader
 * leaves it after that). The rows go into its `.map-legend-rows`.
 */
export function legendBox(document) {
  const box = document.createElement('details');
  box.className = 'map-legend';
  box.open = !document.defaultView?.matchMedia?.(LEGEND_FOLDED_QUERY).matches;
  const summary = document.createElement('summary');
  summary.className = 'map-legend-summary';
  summary.textContent = 'Legend';
  const rows = document.createElement('div');
  rows.className = 'map-legend-rows';
  rows.setAttribute('role', 'group');
  rows.setAttribute('aria-label', 'Classes on the map');
  box.append(summary, rows);
  for (const type of ['click', 'dblclick', 'wheel', 'mousedown', 'touchstart']) {
    box.addEventListener(type, (event) => event.stopPropagation(), { passive: true });
  }
  return box;
}
