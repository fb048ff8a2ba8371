// The map's look, as MapLibre style objects: a colour per class, the layers that draw the
// annotation tiles (shapes, the low-zoom count points, highlight and link overlays), the base
// layer. Pure data, no WebGL: tests/js/map-style.test.mjs checks it in Node.
//
// Class names come from the data, so they are compared with `==` in `case` expressions and
// kept in `Map`s: MapLibre's `match` stores its labels as keys of a plain object, where
// `__proto__` or `constructor` collide with Object.prototype ("Branch labels must be unique").

export const ANNOTATIONS = 'annotations'; // the vector source and its source layer
export const HIGHLIGHT = 'highlight'; // GeoJSON: link lines and marks of highlighted ids
export const BASE = 'base'; // the raster base source, or the tiles' base layer

export const HIGHLIGHT_COLOR = '#ffb000';
export const LINK_COLOR = '#111827';
export const SELECTED_COLOR = '#d6006f';
export const FOCUS_COLOR = '#0b5fff';
export const BACKGROUND_COLOR = '#eceae6';
const FALLBACK_COLOR = '#7f7f7f';
/** From this zoom the tiles carry every shape, so the highlight's marks give way to outlines. */
const MARK_MAXZOOM = 16;

const KNOWN_CLASS_COLORS = new Map([
  ['tree', '#2e8b57'],
  ['house', '#c0504d'],
  ['building', '#a0522d'],
  ['pool', '#1f77b4'],
  ['road', '#555555'],
  ['path', '#8c6d31'],
  ['car', '#9467bd'],
  ['field', '#bcbd22'],
  ['water', '#17becf'],
]);
const PALETTE = [
  '#e377c2', '#ff7f0e', '#7f7f7f', '#393b79', '#637939', '#8c564b', '#d62728', '#3182bd',
  '#e6550d', '#31a354', '#756bb1', '#636363',
];

/**
 * A colour for every class in `classes`, distinct as long as the palette lasts: known classes
 * keep their colour, the others take unused palette colours in sorted order.
 *
 * @param {Iterable<string>} classes
 * @returns {Map<string, string>}
 */
export function classColors(classes) {
  const colors = new Map();
  const used = new Set();
  const sorted = [...new Set(classes)].map(String).sort();
  for (const name of sorted) {
    if (KNOWN_CLASS_COLORS.has(name)) {
      colors.set(name, KNOWN_CLASS_COLORS.get(name));
      used.add(KNOWN_CLASS_COLORS.get(name));
    }
  }
  const free = PALETTE.filter((color) => !used.has(color));
  let next = 0;
  for (const name of sorted) {
    if (!colors.has(name)) {
      colors.set(name, free.length ? free[next % free.length] : PALETTE[next % PALETTE.length]);
      next += 1;
    }
  }
  return colors;
}

/** `['case', class == a, colour a, …, fallback]`: the class colour of a feature. */
export function classColorExpression(colors) {
  const branches = [];
  for (const [name, color] of colors) branches.push(['==', ['get', 'class'], ['literal', name]], color);
  return branches.length ? ['case', ...branches, FALLBACK_COLOR] : FALLBACK_COLOR;
}

/** The filter that keeps features of visible classes only (hidden: class names). */
export function visibleClassFilter(hidden) {
  const names = [...hidden].map(String);
  return names.length ? ['!', ['in', ['get', 'class'], ['literal', names]]] : true;
}

/**
 * A filter true for the features whose id is in `ids`, cheap for 100,000 ids: `match` keeps
 * its numeric labels in a hash (one lookup per feature), `in` over a literal would scan it.
 */
export function idFilter(ids) {
  const unique = [...new Set(ids)].filter((id) => Number.isSafeInteger(id));
  if (!unique.length) return false;
  return ['match', ['to-number', ['get', 'id'], -1], unique, true, false];
}

const state = (name) => ['boolean', ['feature-state', name], false];
const IS_FEATURE = ['has', 'id'];
const IS_COUNT = ['all', ['!', ['has', 'id']], ['has', 'count']];
const geometry = (...types) => ['in', ['geometry-type'], ['literal', types]];

/** A paint value that follows the selection, focus and (for overlays) nothing else. */
function stateful(selected, focused, otherwise) {
  return ['case', state('selected'), selected, state('focused'), focused, otherwise];
}

/**
 * The annotation layers, bottom to top. Their filters are combined with the class filter by
 * `layerFilter`; the highlight and link-target overlays also with their id filter.
 *
 * @param {Map<string, string>} colors
 */
export function annotationLayers(colors) {
  const color = classColorExpression(colors);
  const source = { source: ANNOTATIONS, 'source-layer': ANNOTATIONS };
  return [
    { id: 'ann-fill', type: 'fill', ...source, filter: ['all', IS_FEATURE, geometry('Polygon')],
      paint: { 'fill-color': stateful(SELECTED_COLOR, color, color), 'fill-opacity': stateful(0.55, 0.45, 0.35) } },
    { id: 'ann-line', type: 'line', ...source, filter: ['all', IS_FEATURE, geometry('Polygon', 'LineString')],
      layout: { 'line-join': 'round', 'line-cap': 'round' },
      paint: {
        'line-color': stateful(SELECTED_COLOR, FOCUS_COLOR, color),
        'line-width': ['case', ['==', ['geometry-type'], 'LineString'], stateful(5, 5, 3), stateful(4, 4, 1.5)],
        'line-opacity': 0.9,
      } },
    { id: 'ann-counts', type: 'circle', ...source, filter: IS_COUNT,
      paint: {
        'circle-color': color,
        'circle-opacity': 0.55,
        'circle-radius': ['interpolate', ['linear'], ['sqrt', ['to-number', ['get', 'count'], 1]], 1, 3.5, 100, 24],
        'circle-stroke-color': '#ffffff',
        'circle-stroke-width': 1,
      } },
    { id: 'ann-link-target', type: 'line', ...source, filter: false, overlay: 'linkTargets',
      paint: { 'line-color': LINK_COLOR, 'line-width': 2, 'line-dasharray': [2, 1.5] } },
    { id: 'ann-highlight-line', type: 'line', ...source, filter: false, overlay: 'highlighted',
      layout: { 'line-join': 'round', 'line-cap': 'round' },
      paint: { 'line-color': stateful(SELECTED_COLOR, FOCUS_COLOR, HIGHLIGHT_COLOR), 'line-width': 3.5 } },
    { id: 'ann-point', type: 'circle', ...source, filter: ['all', IS_FEATURE, geometry('Point')],
      paint: {
        'circle-color': color,
        'circle-radius': stateful(7, 7, 5),
        'circle-stroke-color': stateful(SELECTED_COLOR, FOCUS_COLOR, '#ffffff'),
        'circle-stroke-width': stateful(3, 3, 1),
      } },
    { id: 'ann-highlight-point', type: 'circle', ...source, filter: false, overlay: 'highlighted',
      paint: {
        'circle-color': 'rgba(0,0,0,0)',
        'circle-radius': 7,
        'circle-stroke-color': stateful(SELECTED_COLOR, FOCUS_COLOR, HIGHLIGHT_COLOR),
        'circle-stroke-width': 3,
      } },
    { id: 'highlight-links', type: 'line', source: HIGHLIGHT, filter: ['==', ['geometry-type'], 'LineString'],
      paint: { 'line-color': LINK_COLOR, 'line-width': 1.5, 'line-opacity': 0.85, 'line-dasharray': [3, 2.5] } },
    { id: 'highlight-marks', type: 'circle', source: HIGHLIGHT, filter: ['==', ['geometry-type'], 'Point'], maxzoom: MARK_MAXZOOM,
      paint: {
        'circle-color': 'rgba(255,176,0,0.35)',
        'circle-radius': 4,
        'circle-stroke-color': HIGHLIGHT_COLOR,
        'circle-stroke-width': 2,
      } },
  ];
}

/** The layers a user clicks and hovers (features, not count points or overlays). */
export const FEATURE_LAYERS = Object.freeze(['ann-fill', 'ann-line', 'ann-point']);
/** The overlays drawn for the highlighted ids. */
export const HIGHLIGHT_LAYERS = Object.freeze(['ann-highlight-line', 'ann-highlight-point', 'highlight-marks']);

/**
 * A layer's filter now: its own, narrowed to the visible classes (`classes`, from
 * visibleClassFilter) and, for an overlay, to its ids (`ids`, from idFilter; false: none).
 */
export function layerFilter(layer, { classes = true, ids = false } = {}) {
  let own = layer.filter;
  if (layer.overlay) {
    if (ids === false) return false;
    own = ['all', layer.type === 'circle' ? geometry('Point') : geometry('Polygon', 'LineString'), ids];
  }
  return classes === true ? own : ['all', own, classes];
}

/**
 * The data's [w, s, e, n] from the tile JSON, or null (no annotations, or no usable bounds).
 * The map fits its first view to them, and its annotation source asks no tile outside them: a
 * fitted view's margins otherwise cost requests, worker messages and frames for empty tiles
 * (at 1,000,000 annotations, 4 of the first 6 tiles).
 *
 * @param {{bounds?: unknown, total?: number}} json
 * @returns {number[] | null}
 */
export function dataBounds(json) {
  const b = json?.bounds;
  if (!json?.total || !Array.isArray(b) || b.length !== 4 || !b.every(Number.isFinite)) return null;
  return b[0] <= b[2] && b[1] <= b[3] ? [...b] : null;
}

/**
 * The whole MapLibre style: the base layer (a raster tile URL when one is configured, else the
 * demo's quiet blocks, parks and lots from the tiles' `base` layer), the annotation source and
 * its layers, the highlight's GeoJSON source.
 *
 * @param {{tiles: string[], minzoom?: number, maxzoom?: number, bounds?: number[], total?: number}} annotations tile JSON
 * @param {Map<string, string>} colors
 * @param {{rasterUrl?: string}} [options]
 */
export function mapStyle(annotations, colors, { rasterUrl = '' } = {}) {
  const sources = {
    [ANNOTATIONS]: {
      type: 'vector',
      tiles: annotations.tiles,
      minzoom: annotations.minzoom ?? 0,
      maxzoom: annotations.maxzoom ?? 16,
      promoteId: 'id',
      ...(dataBounds(annotations) ? { bounds: dataBounds(annotations) } : {}),
    },
    [HIGHLIGHT]: { type: 'geojson', data: { type: 'FeatureCollection', features: [] } },
  };
  const layers = [{ id: 'background', type: 'background', paint: { 'background-color': BACKGROUND_COLOR } }];
  if (rasterUrl) {
    sources[BASE] = { type: 'raster', tiles: [rasterUrl], tileSize: 256, maxzoom: 19 };
    layers.push({ id: 'base-raster', type: 'raster', source: BASE });
  } else {
    layers.push(...quietBaseLayers());
  }
  for (const layer of annotationLayers(colors)) {
    const { overlay, ...spec } = layer;
    if (overlay) spec.filter = false;
    layers.push(spec);
  }
  return { version: 8, sources, layers };
}

/**
 * The demo's base map, under everything: blocks as pale land, parks green, lots as hairlines
 * (the tiles' `base` layer, where the demo neighbourhood is); the streets are the gaps.
 */
export function quietBaseLayers() {
  const base = { source: ANNOTATIONS, 'source-layer': BASE };
  const kind = (value) => ['==', ['get', 'kind'], value];
  return [
    { id: 'base-blocks', type: 'fill', ...base, filter: kind('block'), paint: { 'fill-color': '#f7f5f0' } },
    { id: 'base-parks', type: 'fill', ...base, filter: kind('park'), paint: { 'fill-color': '#dcebd3' } },
    { id: 'base-lots', type: 'line', ...base, filter: kind('lot'), paint: { 'line-color': '#e2ded6', 'line-width': 0.5 } },
  ];
}
