// The annotation map: MapLibre GL (WebGL) fed by the app's vector tiles
// (/tiles/annotations/{z}/{x}/{y}.mvt), one colour per class, and the page's one source of map
// state (view, visible classes, highlight, selection) for the chat, the client tools and the
// question contexts. This module puts the parts together; each part has a module of its own:
// map-style (colours, layers), map-legend, map-highlight (+ map-highlight-plan), map-selection,
// map-popup, map-contexts, map-view (view maths) and map-data (what it asks the server).
// The worker is vendored next to MapLibre and started from the same origin (docs/security.md).
// Text from the data (class names, attributes) only ever goes into the page as textContent.

import * as maplibregl from '../vendor/maplibre-gl/maplibre-gl.mjs';
import { createMapData } from './map-data.js';
import { mapContexts, mapImage } from './map-contexts.js';
import { createHighlight } from './map-highlight.js';
import { integers } from './map-highlight-plan.js';
import { countsOf, legendBox, legendModel, renderLegend } from './map-legend.js';
import { describeFeature, popupContent } from './map-popup.js';
import { createSelection } from './map-selection.js';
import {
  ANNOTATIONS, FEATURE_LAYERS, HIGHLIGHT_LAYERS, annotationLayers, classColors, dataBounds, idFilter,
  layerFilter, mapStyle, visibleClassFilter,
} from './map-style.js';
import { boundsOf, viewOf } from './map-view.js';

const FOCUS_MS = 1600;
const FOCUS_MAX_IDS = 500;
const FIT = Object.freeze({ padding: 32, maxZoom: 18, duration: 0 });
const FALLBACK_VIEW = Object.freeze({ center: [0, 0], zoom: 1 });
const FEATURE = (id) => ({ source: ANNOTATIONS, sourceLayer: ANNOTATIONS, id });

/** A control of MapLibre's corners holding `element`. */
function slot(map, element, position) {
  map.addControl({ onAdd: () => element, onRemove: () => element.remove() }, position);
  return element;
}

function box(document, className) {
  const element = document.createElement('div');
  element.className = className;
  return element;
}

/** The first rendered feature under `point` among the clickable layers, or null. */
function featureAt(map, point) {
  const [feature] = map.queryRenderedFeatures(point, { layers: FEATURE_LAYERS });
  return feature && Number.isSafeInteger(feature.properties?.id) ? feature : null;
}

/** The classes' visibility, the id overlays, and the layer filters that follow from both. */
function createFilters(map, onChange) {
  const hidden = new Set();
  const overlays = new Map([['highlighted', false], ['linkTargets', false]]);
  let counts = new Map();
  let layers = [];

  function apply() {
    const classes = visibleClassFilter(hidden);
    for (const layer of layers) {
      if (layer.source !== ANNOTATIONS) continue;
      map.setFilter(layer.id, layerFilter(layer, { classes, ids: overlays.get(layer.overlay) ?? false }));
    }
  }
  return {
    hidden,
    counts: () => counts,
    setData(nextCounts, colors) {
      counts = nextCounts;
      layers = annotationLayers(colors);
      for (const layer of layers) {
        for (const [key, value] of Object.entries(layer.paint ?? {})) map.setPaintProperty(layer.id, key, value);
      }
      apply();
    },
    setOverlay(name, ids) {
      overlays.set(name, idFilter(ids));
      apply();
    },
    setVisible(name, visible) {
      if (!counts.has(name) || hidden.has(name) === !visible) return false;
      if (visible) hidden.delete(name);
      else hidden.add(name);
      apply();
      onChange();
      return true;
    },
    visible: () => [...counts.keys()].filter((name) => !hidden.has(name)).sort(),
  };
}

/** Popups of clicked annotations, the count points' zoom-in, hover text and cursor. */
function wireClicks(map, { selection, hintsFor, element }) {
  let popup = null;
  map.on('click', (event) => {
    const feature = featureAt(map, event.point);
    if (!feature) {
      const [count] = map.queryRenderedFeatures(event.point, { layers: ['ann-counts'] });
      if (count) map.easeTo({ center: event.lngLat, zoom: map.getZoom() + 2 });
      return;
    }
    const id = feature.properties.id;
    if (selection.click(id, feature.properties.class)) return;
    const type = feature.geometry.type;
    const lngLat = type === 'Point' ? { lng: feature.geometry.coordinates[0], lat: feature.geometry.coordinates[1] } : event.lngLat;
    popup?.remove();
    popup = new maplibregl.Popup({ className: 'gs-annotation-popup', maxWidth: '18rem' })
      .setLngLat(lngLat)
      .setDOMContent(popupContent(element.ownerDocument, { id, type, properties: feature.properties, lngLat }, hintsFor(id)))
      .addTo(map);
  });
  map.on('mousemove', (event) => {
    const feature = featureAt(map, event.point);
    const canvas = map.getCanvas();
    canvas.style.cursor = feature ? (element.hasAttribute('data-selecting') ? 'crosshair' : 'pointer') : '';
    canvas.title = feature ? describeFeature({ id: feature.properties.id, properties: feature.properties }) : '';
  });
  return { closePopup: () => popup?.remove() };
}

/** Resolves once the map has drawn everything it is loading (at once when it already has). */
function idle(map) {
  if (map.loaded() && !map.isMoving() && map.areTilesLoaded()) return Promise.resolve();
  return new Promise((resolve) => map.once('idle', resolve));
}

/** The MapLibre map in `element`, its style built from the tile JSON, loaded. */
async function createGlMap(element, data) {
  const json = await data.tileJson();
  const counts = countsOf(json.counts);
  const colors = classColors(counts.keys());
  const bounds = dataBounds(json);
  const map = new maplibregl.Map({
    container: element,
    style: mapStyle(json, colors, { rasterUrl: element.dataset.tileUrl || '' }),
    ...(bounds ? { bounds, fitBoundsOptions: { padding: 24 } } : FALLBACK_VIEW),
    maxZoom: 21,
    attributionControl: false,
    dragRotate: false,
    pitchWithRotate: false,
    touchPitch: false,
    fadeDuration: 0,
  });
  map.touchZoomRotate.disableRotation();
  map.keyboard.disableRotation();
  await new Promise((resolve, reject) => {
    map.once('load', resolve);
    map.once('error', (event) => reject(event.error ?? new Error('the map failed to load')));
  });
  // The panel may have been laid out after the map was created: fit to the data in its size now.
  map.resize();
  if (bounds) map.fitBounds(bounds, { padding: 24, duration: 0 });
  return { map, json, counts, colors };
}

const RENDERED = Object.freeze({
  features: [FEATURE_LAYERS, 'id'],
  highlighted: [HIGHLIGHT_LAYERS, 'id'],
  linkTargets: [['ann-link-target'], 'id'],
  links: [['highlight-links'], 'index'],
  classes: [[...FEATURE_LAYERS, 'ann-counts'], 'class'],
});

/**
 * What is drawn on screen now, sorted: ids of the annotation shapes (`features`), of the
 * highlight (`highlighted`) or link-target (`linkTargets`) overlays, the indexes of the
 * link lines (`links`), or the classes of shapes and count points (`classes`). What tests
 * and benches read instead of a DOM of shapes.
 */
function renderedIds(map, which = 'features') {
  const [layers, key] = RENDERED[which] ?? RENDERED.features;
  const values = new Set();
  for (const feature of map.queryRenderedFeatures({ layers })) {
    const value = feature.properties?.[key];
    if (Number.isSafeInteger(value) || (key === 'class' && typeof value === 'string')) values.add(value);
  }
  return [...values].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/** Where annotation `id` is drawn, in container pixels (a point a click hits), or null. */
function screenPoint(map, id) {
  const [feature] = map.queryRenderedFeatures({ layers: FEATURE_LAYERS, filter: ['==', ['get', 'id'], id] });
  if (!feature) return null;
  const { type, coordinates } = feature.geometry;
  let at;
  if (type === 'Point') at = coordinates;
  else if (type === 'LineString') at = coordinates[Math.floor(coordinates.length / 2)];
  else if (type === 'MultiLineString') at = coordinates[0][Math.floor(coordinates[0].length / 2)];
  else {
    const ring = type === 'Polygon' ? coordinates[0] : coordinates[0][0];
    const [w, s, e, n] = boundsOf(ring.map(([x, y]) => [x, y, x, y]));
    at = [(w + e) / 2, (s + n) / 2];
  }
  const point = map.project(at);
  return { x: point.x, y: point.y };
}

/**
 * Mounts the map in `element` and starts loading. Returns at once with the map object the
 * page keeps as `window.geosenseMap`: `ready` is a promise until the first annotations are
 * drawn (or the load failed: `error` then says why) and `true` afterwards, so
 * `await map.ready` works at any time; `loaded` is the promise.
 *
 * @param {HTMLElement} element with data-tiles-url, data-boxes-url and optional data-tile-url
 *   (a raster base layer; without it the tiles' quiet demo base is drawn)
 * @param {{fetch?: typeof fetch}} [options]
 */
export function createAnnotationMap(element, { fetch = globalThis.fetch } = {}) {
  // Start the tile worker now, while the tile JSON is on its way (not after the style is built).
  maplibregl.prewarm();
  const data = createMapData({
    tilesUrl: element.dataset.tilesUrl || '/tiles/annotations.json',
    boxesUrl: element.dataset.boxesUrl || '/api/annotations/boxes',
    fetch,
  });
  const parts = {};
  let done = false;
  const whenLoaded = (fn) => async (...args) => {
    await api.loaded;
    if (!parts.map) throw new Error(api.error || 'the map is not loaded');
    return fn(...args);
  };

  const api = {
    map: null,
    count: 0,
    revision: null,
    error: null,
    loaded: null,
    get ready() {
      return done ? true : api.loaded;
    },
    highlightedIds: () => parts.highlight?.highlightedIds() ?? [],
    linkTargetIds: () => parts.highlight?.linkTargetIds() ?? [],
    links: () => parts.highlight?.links() ?? [],
    visibleClasses: () => parts.filters?.visible() ?? [],
    setClassVisible: (name, visible) => parts.setClassVisible?.(name, visible),
    highlight: whenLoaded((payload) => parts.highlight.highlight(payload)),
    clearHighlight: () => parts.highlight?.clear(),
    focus: whenLoaded((ids) => parts.focus(ids)),
    // Before the map is loaded (or when it failed), the whole world with no classes.
    view: () => parts.view?.() ?? viewOf({ center: { lng: 0, lat: 0 }, zoom: FALLBACK_VIEW.zoom, bounds: [-180, -90, 180, 90], classes: [] }),
    contexts: whenLoaded((types) => mapContexts(types, parts)),
    select: whenLoaded((options) => parts.selection.select(options)),
    selectedIds: () => parts.selection?.selectedIds() ?? [],
    focusedIds: () => [...(parts.focused ?? [])].sort((a, b) => a - b),
    refresh: whenLoaded((revision) => parts.refresh(revision)),
    idle: whenLoaded(() => idle(parts.map)),
    renderedIds: (which) => (parts.map ? renderedIds(parts.map, which) : []),
    screenPoint: (id) => (parts.map ? screenPoint(parts.map, id) : null),
  };

  // A write to the annotations anywhere (socket frame `annotations-changed`, page.js): new
  // counts and tiles, one refresh at a time; a revision already shown is skipped.
  let refreshing = Promise.resolve();
  element.ownerDocument.addEventListener('geosense:annotations-changed', (event) => {
    refreshing = refreshing.then(() => api.refresh(event.detail?.revision)).catch((error) => {
      console.warn('GeoSense map: refreshing after a change failed:', error);
    });
  });

  api.loaded = (async () => {
    try {
      await mount(element, data, parts, api);
      await idle(parts.map);
    } catch (error) {
      api.error = String(error?.message || error);
      const note = element.ownerDocument.createElement('p');
      note.className = 'map-error';
      note.setAttribute('role', 'alert');
      note.textContent = 'The annotations could not be loaded.';
      element.appendChild(note);
    } finally {
      done = true;
      element.dataset.state = api.error ? 'error' : 'ready';
      element.dispatchEvent(new CustomEvent('geosense:map-ready', { detail: api }));
    }
  })();
  return api;
}

/** Builds the map and its parts into `parts` (see createAnnotationMap). */
async function mount(element, data, parts, api) {
  const document = element.ownerDocument;
  const { map, json, counts, colors } = await createGlMap(element, data);
  parts.map = api.map = map;
  api.count = json.total ?? 0;
  api.revision = json.revision ?? null;
  const legend = slot(map, legendBox(document), 'bottom-right');
  const topRight = slot(map, box(document, 'gs-map-bar-slot'), 'top-right');
  const topLeft = slot(map, box(document, 'gs-map-bar-slot'), 'top-left');
  let colorsNow = colors;
  const drawLegend = () => renderLegend(legend, legendModel(filters.counts(), colorsNow, filters.hidden), parts.setClassVisible);
  const filters = createFilters(map, () => {
    drawLegend();
    element.dispatchEvent(new CustomEvent('geosense:map-classes', { detail: filters.visible() }));
  });
  parts.filters = filters;
  filters.setData(counts, colors);
  const setState = (id, key, on) => map.setFeatureState(FEATURE(id), { [key]: on });
  const showClasses = (names) => {
    for (const name of names) filters.setVisible(name, true);
  };
  const fit = ([w, s, e, n]) => map.fitBounds([[w, s], [e, n]], FIT);
  parts.highlight = createHighlight({
    map, container: element, barSlot: topRight, locate: data.locate,
    setOverlay: filters.setOverlay, showClasses, fit,
  });
  let clicks = null;
  parts.selection = createSelection({
    container: topLeft, element, setState: (id, on) => setState(id, 'selected', on),
    showClass: (name) => showClasses([name]), closePopup: () => clicks?.closePopup(),
  });
  clicks = wireClicks(map, { selection: parts.selection, hintsFor: parts.highlight.hintsFor, element });
  parts.setClassVisible = (name, visible) => {
    if (filters.setVisible(name, Boolean(visible)) && !visible) clicks.closePopup();
  };
  parts.view = () => {
    const b = map.getBounds();
    return viewOf({ center: map.getCenter(), zoom: map.getZoom(), bounds: [b.getWest(), b.getSouth(), b.getEast(), b.getNorth()], classes: filters.visible() });
  };
  parts.hiddenClasses = () => [...filters.hidden].sort();
  parts.image = () => mapImage(map, parts.highlight.visibleLabels());
  parts.focused = new Set();
  parts.focus = focusing(map, data, parts, { setState, showClasses, fit });
  parts.refresh = async (revision) => {
    if (revision && revision === api.revision) return false;
    const next = await data.tileJson();
    api.revision = next.revision ?? null;
    api.count = next.total ?? 0;
    const nextCounts = countsOf(next.counts);
    colorsNow = classColors(nextCounts.keys());
    filters.setData(nextCounts, colorsNow);
    setSourceTiles(map.getSource(ANNOTATIONS), next);
    drawLegend();
    return true;
  };
  drawLegend();
}

/**
 * New tile URLs for the annotation source, and the data's new bounds when there are some (a
 * write may have put annotations outside the old ones): MapLibre reads a vector source's
 * bounds from its options each time it loads it, which setTiles does.
 */
function setSourceTiles(source, json) {
  const bounds = dataBounds(json);
  if (bounds) source._options.bounds = bounds;
  source.setTiles(json.tiles);
}

/** focus(ids): fit the view to the live ones among `ids` and flash them; resolves their ids. */
function focusing(map, data, parts, { setState, showClasses, fit }) {
  let timer = null;
  return async (ids) => {
    const boxes = await data.locate(integers(ids).slice(0, FOCUS_MAX_IDS));
    const found = [...boxes.keys()].sort((a, b) => a - b);
    if (!found.length) return found;
    showClasses(new Set(found.map((id) => boxes.get(id).class)));
    fit(boundsOf(found.map((id) => boxes.get(id).box)));
    for (const id of parts.focused) setState(id, 'focused', false);
    parts.focused.clear();
    for (const id of found) {
      parts.focused.add(id);
      setState(id, 'focused', true);
    }
    clearTimeout(timer);
    timer = setTimeout(() => {
      for (const id of parts.focused) setState(id, 'focused', false);
      parts.focused.clear();
    }, FOCUS_MS);
    return found;
  };
}
