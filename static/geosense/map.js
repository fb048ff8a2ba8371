// The annotation map: draws the annotations of /api/annotations on a Leaflet map, one style
// per class, and is the page's one source of map state (view, visible classes, highlight,
// selection) for the chat, the client tools and the question contexts.
// Shapes go through Leaflet's SVG renderer, so each one is a DOM element carrying
// data-annotation-id and data-annotation-class; every state change is written as an SVG
// attribute too (not only CSS), so the image context serialises what the user sees.
// Text from the data (class names, attributes) only ever goes into the page as textContent.

import { FORMATTERS, formatArea, formatLength, formatLinkValue, formatPosition } from './format.js';
import { MAP_CONTEXT_TYPES as CONTEXT_TYPES } from './wire.js';

const KNOWN_CLASS_COLORS = Object.freeze({
  tree: '#2e8b57',
  house: '#c0504d',
  building: '#a0522d',
  pool: '#1f77b4',
  road: '#555555',
  path: '#8c6d31',
  car: '#9467bd',
  field: '#bcbd22',
  water: '#17becf',
});
const PALETTE = [
  '#e377c2', '#ff7f0e', '#7f7f7f', '#393b79', '#637939', '#8c564b', '#d62728', '#3182bd',
  '#e6550d', '#31a354', '#756bb1', '#636363',
];
const FALLBACK_VIEW = { center: [0, 0], zoom: 2 };
const HIGHLIGHT_COLOR = '#ffb000';
const LINK_COLOR = '#111827';
const SELECTED_COLOR = '#d6006f';
const FOCUS_MS = 1600;
const FIT_OPTIONS = Object.freeze({ padding: [32, 32], maxZoom: 19 });
const IMAGE_MAX_WIDTH = 800;
const IMAGE_BACKGROUND = '#eef0ec';
const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * A colour for every class in `classes`, distinct as long as the palette lasts: known classes
 * keep their colour, the others take unused palette colours in sorted order.
 *
 * @param {string[]} classes
 * @returns {Map<string, string>}
 */
export function classColors(classes) {
  const colors = new Map();
  const used = new Set();
  const sorted = [...new Set(classes)].sort();
  for (const name of sorted) {
    if (KNOWN_CLASS_COLORS[name]) {
      colors.set(name, KNOWN_CLASS_COLORS[name]);
      used.add(KNOWN_CLASS_COLORS[name]);
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

/**
 * A short human description of a feature: "pool 25 · 48 m²" or "road 3 · 120 m".
 *
 * @param {{id: number|string, properties?: {class?: string, area_m2?: number, length_m?: number}}} feature
 * @returns {string}
 */
export function describeFeature(feature) {
  const props = feature.properties || {};
  const parts = [`${props.class ?? 'annotation'} ${feature.id}`];
  if (props.area_m2) parts.push(formatArea(props.area_m2));
  else if (props.length_m) parts.push(formatLength(props.length_m));
  return parts.join(' · ');
}

function baseStyle(color, geometryType) {
  if (geometryType.includes('LineString')) {
    return { color, weight: 3, opacity: 0.9, fill: false, dashArray: null };
  }
  if (geometryType.includes('Point')) {
    return { color: '#ffffff', weight: 1, opacity: 1, fillColor: color, fillOpacity: 0.95, radius: 5, dashArray: null };
  }
  return { color, weight: 1.5, opacity: 0.9, fillColor: color, fillOpacity: 0.35, dashArray: null };
}

function elementsOf(layer) {
  if (typeof layer.eachLayer === 'function') {
    const elements = [];
    layer.eachLayer((child) => elements.push(...elementsOf(child)));
    return elements;
  }
  const element = typeof layer.getElement === 'function' ? layer.getElement() : null;
  return element ? [element] : [];
}

function centreOf(layer) {
  return typeof layer.getLatLng === 'function' ? layer.getLatLng() : layer.getBounds().getCenter();
}

function integers(values) {
  return Array.isArray(values) ? values.filter((value) => Number.isInteger(value)) : [];
}

function node(tag, { className, text, testid } = {}) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text !== undefined) element.textContent = text;
  if (testid) element.setAttribute('data-testid', testid);
  return element;
}

function button(text, testid, onClick) {
  const element = node('button', { text, testid });
  element.type = 'button';
  element.addEventListener('click', onClick);
  return element;
}

const round = (value, digits) => Number(value.toFixed(digits));
const clamp = (value, low, high) => Math.min(high, Math.max(low, value));

/**
 * Highlight attribute hints as text, per feature and for the whole set: a hinted key whose value
 * is a list aligned with `ids` (index by index) belongs to each feature, any other value to the
 * set. A `position` pair list counts as aligned only when its items are themselves positions.
 *
 * @returns {{perFeature: Map<number, [string, string][]>, overall: [string, string][]}}
 */
export function hintTexts(data) {
  const ids = Array.isArray(data.ids) ? data.ids : [];
  const perFeature = new Map();
  const overall = [];
  const hints = data.attributeHints && typeof data.attributeHints === 'object' ? data.attributeHints : {};
  for (const [key, type] of Object.entries(hints)) {
    if (!(key in data)) continue;
    const format = FORMATTERS[type] ?? ((value) => String(value));
    const value = data[key];
    const aligned = Array.isArray(value) && value.length === ids.length
      && (type !== 'position' || value.every((item) => item && typeof item === 'object'));
    if (!aligned) {
      overall.push([key, format(value)]);
      continue;
    }
    ids.forEach((id, i) => {
      if (!Number.isInteger(id)) return;
      if (!perFeature.has(id)) perFeature.set(id, []);
      perFeature.get(id).push([key, format(value[i])]);
    });
  }
  return { perFeature, overall };
}

/**
 * Mounts the map in `element` and starts loading the annotations. Returns at once with the map
 * object the page keeps as `window.geosenseMap`. `ready` is a promise until the annotations are
 * drawn (or the load failed: `error` then says why) and `true` afterwards, so `await map.ready`
 * works at any time; `loaded` is the promise.
 *
 * @param {HTMLElement} element with data-annotations-url and optional data-tile-url
 * @param {{L?: object, fetch?: typeof fetch}} [options]
 */
export function createAnnotationMap(element, { L = globalThis.L, fetch = globalThis.fetch } = {}) {
  const renderer = L.svg({ padding: 0.5 });
  const map = L.map(element, { preferCanvas: false, renderer, zoomSnap: 0.25 });
  const tileUrl = element.dataset.tileUrl;
  if (tileUrl) {
    L.tileLayer(tileUrl, { maxZoom: 22, attribution: '' }).addTo(map);
  }
  map.setView(FALLBACK_VIEW.center, FALLBACK_VIEW.zoom);

  const features = new Map(); // id → {layer, feature, name, base}
  const classes = new Map(); // class → {count, color, visible, checkbox}
  const highlighted = new Set();
  const linkTargets = new Set();
  const selected = new Set();
  const focused = new Set();
  let hints = new Map();
  let linkLayer = null;
  let linkLabels = [];
  let highlightBar = null;
  let selection = null;
  let focusTimer = null;
  let done = false;

  function tag(id) {
    const entry = features.get(id);
    const hidden = !classes.get(entry.name).visible;
    for (const svg of elementsOf(entry.layer)) {
      svg.setAttribute('data-annotation-id', id);
      svg.setAttribute('data-annotation-class', entry.name);
      svg.setAttribute('data-highlighted', String(highlighted.has(id)));
      svg.toggleAttribute('data-link-target', linkTargets.has(id));
      svg.toggleAttribute('data-selected', selected.has(id));
      svg.toggleAttribute('data-focused', focused.has(id));
      svg.style.display = hidden ? 'none' : '';
      svg.setAttribute('aria-hidden', String(hidden));
    }
  }

  /** Restyle one feature from its state; selection wins over highlight over link target. */
  function restyle(id) {
    const entry = features.get(id);
    if (!entry) return;
    const style = { ...entry.base };
    const isPoint = entry.feature.geometry.type.includes('Point');
    if (linkTargets.has(id)) Object.assign(style, { color: LINK_COLOR, weight: 2, dashArray: '4 3', opacity: 1 });
    if (highlighted.has(id)) {
      Object.assign(style, isPoint
        ? { color: HIGHLIGHT_COLOR, weight: 3, radius: 7, opacity: 1 }
        : { color: HIGHLIGHT_COLOR, weight: 3.5, opacity: 1, dashArray: null });
    }
    if (focused.has(id)) Object.assign(style, { color: '#0b5fff', weight: 4, opacity: 1 });
    if (selected.has(id)) {
      Object.assign(style, { color: SELECTED_COLOR, weight: 4, opacity: 1, dashArray: null });
      if (!isPoint && entry.feature.geometry.type.includes('Polygon')) style.fillOpacity = 0.55;
    }
    entry.layer.setStyle(style);
    if (highlighted.has(id) || selected.has(id) || focused.has(id)) entry.layer.bringToFront();
    tag(id);
  }

  function popupContent(id) {
    const { feature, name, layer } = features.get(id);
    const props = feature.properties || {};
    const box = node('div', { className: 'gs-popup', testid: 'annotation-popup' });
    box.appendChild(node('strong', { text: `${name || 'annotation'} ${id}` }));
    const list = node('dl');
    const rows = [['id', String(id)], ['class', name || '—']];
    const type = feature.geometry.type;
    if (type.includes('Polygon')) {
      rows.push(['area', formatArea(props.area_m2)], ['perimeter', formatLength(props.length_m)]);
    } else if (type.includes('LineString')) {
      rows.push(['length', formatLength(props.length_m)]);
    } else {
      const { lat, lng } = centreOf(layer);
      rows.push(['position', formatPosition({ lat, lon: lng })]);
    }
    for (const [key, text] of hints.get(id) ?? []) rows.push([key, text]);
    for (const [key, value] of rows) {
      const row = node('div', { className: 'gs-popup-row' });
      row.setAttribute('data-measure', key);
      row.append(node('dt', { text: key }), node('dd', { text: value }));
      list.appendChild(row);
    }
    box.appendChild(list);
    return box;
  }

  function onFeatureClick(id, event) {
    if (selection) {
      L.DomEvent.stop(event);
      selection.toggle(id);
      return;
    }
    L.popup({ className: 'gs-annotation-popup' })
      .setLatLng(event.latlng ?? centreOf(features.get(id).layer))
      .setContent(() => popupContent(id))
      .openOn(map);
  }

  function setClassVisible(name, visible) {
    const entry = classes.get(name);
    if (!entry || entry.visible === Boolean(visible)) return;
    entry.visible = Boolean(visible);
    if (entry.checkbox) entry.checkbox.checked = entry.visible;
    for (const [id, feature] of features) if (feature.name === name) tag(id);
    if (!entry.visible) map.closePopup();
    element.dispatchEvent(new CustomEvent('geosense:map-classes', { detail: visibleClasses() }));
  }

  function visibleClasses() {
    return [...classes].filter(([, entry]) => entry.visible).map(([name]) => name).sort();
  }

  function showClassesOf(ids) {
    for (const id of ids) setClassVisible(features.get(id).name, true);
  }

  function legendControl() {
    const legend = L.control({ position: 'bottomright' });
    legend.onAdd = () => {
      const box = L.DomUtil.create('div', 'map-legend');
      box.setAttribute('role', 'group');
      box.setAttribute('aria-label', 'Classes on the map');
      L.DomEvent.disableClickPropagation(box);
      L.DomEvent.disableScrollPropagation(box);
      for (const [name, entry] of [...classes].sort((a, b) => a[0].localeCompare(b[0]))) {
        const row = L.DomUtil.create('label', 'map-legend-row', box);
        const checkbox = L.DomUtil.create('input', 'map-legend-toggle', row);
        checkbox.type = 'checkbox';
        checkbox.checked = entry.visible;
        checkbox.setAttribute('data-class', name);
        checkbox.addEventListener('change', () => setClassVisible(name, checkbox.checked));
        entry.checkbox = checkbox;
        const swatch = L.DomUtil.create('span', 'map-legend-swatch', row);
        swatch.style.background = entry.color;
        const label = L.DomUtil.create('span', 'map-legend-label', row);
        label.textContent = `${name} (${entry.count})`;
      }
      return box;
    };
    return legend;
  }

  function draw(collection) {
    const list = collection.features || [];
    const colors = classColors(list.map((f) => f.properties?.class ?? ''));
    const layer = L.geoJSON(collection, {
      renderer,
      style: (feature) => baseStyle(colors.get(feature.properties?.class ?? ''), feature.geometry.type),
      pointToLayer: (feature, latlng) =>
        L.circleMarker(latlng, { renderer, ...baseStyle(colors.get(feature.properties?.class ?? ''), 'Point') }),
      onEachFeature: (feature, featureLayer) => {
        const id = Number(feature.id);
        const name = String(feature.properties?.class ?? '');
        const base = baseStyle(colors.get(name), feature.geometry.type);
        features.set(id, { layer: featureLayer, feature, name, base });
        if (!classes.has(name)) classes.set(name, { count: 0, color: colors.get(name), visible: true, checkbox: null });
        classes.get(name).count += 1;
        featureLayer.bindTooltip(() => node('span', { text: describeFeature(feature) }), { sticky: true });
        featureLayer.on('click', (event) => onFeatureClick(id, event));
        featureLayer.on('add', () => tag(id));
      },
    }).addTo(map);
    for (const id of features.keys()) tag(id);
    legendControl().addTo(map);
    return layer;
  }

  function layersOf(ids) {
    return ids.filter((id) => features.has(id)).map((id) => features.get(id).layer);
  }

  function fit(ids) {
    const layers = layersOf(ids);
    if (!layers.length) return;
    const bounds = L.latLngBounds([]);
    for (const layer of layers) {
      if (typeof layer.getLatLng === 'function') bounds.extend(layer.getLatLng());
      else bounds.extend(layer.getBounds());
    }
    map.fitBounds(bounds, FIT_OPTIONS);
  }

  /**
   * Hide the link labels that would cover one already shown, so a dense highlight stays
   * readable; zooming in shows more of them. A grid of screen cells keeps this linear.
   */
  function declutterLabels() {
    const cell = 64;
    const grid = new Map();
    const overlaps = (a, b) => !(a.right < b.left || a.left > b.right || a.bottom < b.top || a.top > b.bottom);
    for (const el of map.getContainer().querySelectorAll('.gs-link-label')) {
      el.classList.remove('gs-label-hidden');
      const box = el.getBoundingClientRect();
      const keys = [];
      for (let x = Math.floor(box.left / cell); x <= Math.floor(box.right / cell); x += 1) {
        for (let y = Math.floor(box.top / cell); y <= Math.floor(box.bottom / cell); y += 1) keys.push(`${x},${y}`);
      }
      if (keys.some((key) => (grid.get(key) || []).some((other) => overlaps(box, other)))) {
        el.classList.add('gs-label-hidden');
        continue;
      }
      for (const key of keys) grid.set(key, [...(grid.get(key) || []), box]);
    }
  }
  map.on('zoomend', declutterLabels);

  /** Undo the current highlight: features, link lines and labels, and the highlight bar. */
  function clearHighlight() {
    const touched = [...highlighted, ...linkTargets];
    highlighted.clear();
    linkTargets.clear();
    hints = new Map();
    for (const id of touched) restyle(id);
    if (linkLayer) linkLayer.remove();
    linkLayer = null;
    linkLabels = [];
    if (highlightBar) highlightBar.remove();
    highlightBar = null;
  }

  function highlightBarControl(count, missing, overall) {
    const bar = L.control({ position: 'topright' });
    bar.onAdd = () => {
      const box = L.DomUtil.create('div', 'gs-highlight-bar');
      box.setAttribute('role', 'status');
      box.setAttribute('data-testid', 'map-highlight-bar');
      L.DomEvent.disableClickPropagation(box);
      let text = `${count} highlighted`;
      if (missing.length) text += ` · ${missing.length} not on the map`;
      box.appendChild(node('span', { text }));
      for (const [key, value] of overall) {
        box.appendChild(node('span', { className: 'gs-highlight-hint', text: `${key}: ${value}` }));
      }
      box.appendChild(button('Clear highlight', 'map-clear-highlight', () => clearHighlight()));
      return box;
    };
    return bar;
  }

  /**
   * Apply a highlight payload (the highlight block's data): mark `ids`, draw a line from
   * ids[i] to links[i] labelled with the formatted linkValues[i], keep the attribute hints
   * for the popups, and fit the map to everything involved. Replaces any earlier highlight.
   *
   * @param {{ids: number[], links?: number[], linkValues?: number[], linkType?: string,
   *          attributeHints?: Record<string, string>}} data
   * @returns {{shown: number[], missing: number[]}}
   */
  function highlight(data) {
    clearHighlight();
    const payload = data && typeof data === 'object' ? data : {};
    const ids = integers(payload.ids);
    const shown = [...new Set(ids.filter((id) => features.has(id)))].sort((a, b) => a - b);
    const missing = [...new Set(ids.filter((id) => !features.has(id)))].sort((a, b) => a - b);
    const links = Array.isArray(payload.links) ? payload.links : [];
    const values = Array.isArray(payload.linkValues) ? payload.linkValues : [];
    for (const id of shown) highlighted.add(id);
    linkLayer = L.layerGroup().addTo(map);
    payload.ids?.forEach?.((id, i) => {
      const target = links[i];
      if (!features.has(id) || !Number.isInteger(target) || !features.has(target)) return;
      if (!highlighted.has(target)) linkTargets.add(target);
      const ends = [centreOf(features.get(id).layer), centreOf(features.get(target).layer)];
      const line = L.polyline(ends, {
        renderer, color: LINK_COLOR, weight: 1.5, opacity: 0.85, dashArray: '5 4', interactive: false,
      }).addTo(linkLayer);
      for (const svg of elementsOf(line)) {
        svg.setAttribute('data-link-index', String(i));
        svg.setAttribute('data-link', `${id}-${target}`);
      }
      if (values[i] !== undefined && values[i] !== null) {
        // A label of its own at the segment's middle: a tooltip bound to the line would be
        // placed where the line was at the zoom before the fit (a sub-pixel line has no centre).
        const at = L.latLngBounds(ends).getCenter();
        const text = formatLinkValue(payload.linkType, values[i]);
        const label = L.tooltip({ permanent: true, direction: 'center', className: 'gs-link-label', interactive: false })
          .setLatLng(at)
          .setContent(text)
          .addTo(linkLayer);
        label.getElement()?.setAttribute('data-link-index', String(i));
        label.getElement()?.setAttribute('data-testid', 'link-label');
        linkLabels.push({ at, text });
      }
    });
    const { perFeature, overall } = hintTexts(payload);
    hints = perFeature;
    showClassesOf([...highlighted, ...linkTargets]);
    for (const id of [...linkTargets, ...highlighted]) restyle(id);
    highlightBar = highlightBarControl(shown.length, missing, overall).addTo(map);
    fit([...highlighted, ...linkTargets]);
    declutterLabels();
    return { shown, missing };
  }

  /**
   * Pan and zoom to these annotations and flash them. Returns the ids that are on the map.
   *
   * @param {number[]} ids
   * @returns {number[]}
   */
  function focus(ids) {
    const found = [...new Set(integers(ids).filter((id) => features.has(id)))].sort((a, b) => a - b);
    if (!found.length) return found;
    showClassesOf(found);
    fit(found);
    const previous = [...focused];
    focused.clear();
    for (const id of previous) restyle(id);
    for (const id of found) {
      focused.add(id);
      restyle(id);
    }
    clearTimeout(focusTimer);
    focusTimer = setTimeout(() => {
      const flashed = [...focused];
      focused.clear();
      for (const id of flashed) restyle(id);
    }, FOCUS_MS);
    return found;
  }

  /** Centre, zoom, bounds ([minLon, minLat, maxLon, maxLat]) and visible classes right now. */
  function view() {
    const centre = map.getCenter();
    const bounds = map.getBounds();
    return {
      center: { lat: round(centre.lat, 6), lon: round(clamp(L.Util.wrapNum(centre.lng, [-180, 180], true), -180, 180), 6) },
      zoom: round(map.getZoom(), 2),
      bounds: [
        round(clamp(bounds.getWest(), -180, 180), 6),
        round(clamp(bounds.getSouth(), -90, 90), 6),
        round(clamp(bounds.getEast(), -180, 180), 6),
        round(clamp(bounds.getNorth(), -90, 90), 6),
      ],
      visible_classes: visibleClasses(),
    };
  }

  /** A PNG of the map as shown: background, the SVG overlay, then the link labels. */
  async function image() {
    const size = map.getSize();
    const scale = Math.min(1, IMAGE_MAX_WIDTH / Math.max(1, size.x));
    const width = Math.max(1, Math.round(size.x * scale));
    const height = Math.max(1, Math.round(size.y * scale));
    const canvas = document.createElement('canvas');
    canvas.width = width;
    canvas.height = height;
    const context = canvas.getContext('2d');
    context.fillStyle = IMAGE_BACKGROUND;
    context.fillRect(0, 0, width, height);
    context.scale(scale, scale);
    const svg = element.querySelector('.leaflet-overlay-pane svg');
    if (svg) {
      const origin = element.getBoundingClientRect();
      const box = svg.getBoundingClientRect();
      const copy = svg.cloneNode(true);
      copy.setAttribute('xmlns', SVG_NS);
      copy.removeAttribute('style');
      const text = new XMLSerializer().serializeToString(copy);
      const picture = new Image();
      picture.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(text)}`;
      await picture.decode();
      context.drawImage(picture, box.left - origin.left, box.top - origin.top, box.width, box.height);
    }
    context.font = '600 12px system-ui, sans-serif';
    context.textAlign = 'center';
    context.textBaseline = 'middle';
    for (const { at, text } of linkLabels) {
      const point = map.latLngToContainerPoint(at);
      context.lineWidth = 3;
      context.strokeStyle = '#ffffff';
      context.strokeText(text, point.x, point.y);
      context.fillStyle = LINK_COLOR;
      context.fillText(text, point.x, point.y);
    }
    return { png: canvas.toDataURL('image/png'), width, height };
  }

  /**
   * The requested data contexts of the view, in the order asked, each type once; unknown types
   * are left out. `visibility` → {classes, hidden}; `position` → {center, zoom, bounds};
   * `image` → {png, width, height}.
   *
   * @param {string[]} types
   * @returns {Promise<{type: string, data: object}[]>}
   */
  async function contexts(types) {
    const wanted = [...new Set(Array.isArray(types) ? types : [])].filter((type) => CONTEXT_TYPES.includes(type));
    const out = [];
    for (const type of wanted) {
      if (type === 'visibility') {
        const classesShown = visibleClasses();
        const hidden = [...classes.keys()].filter((name) => !classesShown.includes(name)).sort();
        out.push({ type, data: { classes: classesShown, hidden } });
      } else if (type === 'position') {
        const { center, zoom, bounds } = view();
        out.push({ type, data: { center, zoom, bounds } });
      } else {
        out.push({ type, data: await image() });
      }
    }
    return out;
  }

  function selectionBar(prompt, onConfirm, onCancel) {
    const bar = node('div', { className: 'gs-select-bar', testid: 'map-select-bar' });
    bar.setAttribute('role', 'dialog');
    bar.setAttribute('aria-label', 'Select annotations on the map');
    const count = node('span', { className: 'gs-select-count', text: '0 selected', testid: 'map-select-count' });
    count.setAttribute('aria-live', 'polite');
    const actions = node('div', { className: 'gs-select-actions' });
    actions.append(
      count,
      button('Confirm', 'map-select-confirm', onConfirm),
      button('Cancel', 'map-select-cancel', onCancel),
    );
    bar.append(node('p', { className: 'gs-select-prompt', text: prompt }), actions);
    L.DomEvent.disableClickPropagation(bar);
    L.DomEvent.disableScrollPropagation(bar);
    const control = L.control({ position: 'topleft' });
    control.onAdd = () => bar;
    control.addTo(map);
    return { control, count };
  }

  /**
   * Selection mode: the user clicks annotations (of `class` only, when given) to toggle them,
   * then Confirm resolves `{ids}` (sorted) and Cancel resolves null. A new select() cancels an
   * open one.
   *
   * @param {{prompt?: string, class?: string}} [options]
   * @returns {Promise<{ids: number[]} | null>}
   */
  function select({ prompt, class: onlyClass } = {}) {
    if (selection) selection.finish(null);
    map.closePopup();
    if (onlyClass && classes.has(onlyClass)) setClassVisible(onlyClass, true);
    element.setAttribute('data-selecting', 'true');
    return new Promise((resolve) => {
      const text = typeof prompt === 'string' && prompt.trim() ? prompt.trim().slice(0, 500) : 'Click annotations to select them.';
      const ui = selectionBar(
        text,
        () => current.finish({ ids: [...selected].sort((a, b) => a - b) }),
        () => current.finish(null),
      );
      const current = {
        toggle(id) {
          if (onlyClass && features.get(id).name !== onlyClass) return;
          if (selected.has(id)) selected.delete(id);
          else selected.add(id);
          restyle(id);
          ui.count.textContent = `${selected.size} selected`;
        },
        finish(result) {
          if (selection !== current) return;
          selection = null;
          const picked = [...selected];
          selected.clear();
          for (const id of picked) restyle(id);
          ui.control.remove();
          element.removeAttribute('data-selecting');
          resolve(result);
        },
      };
      selection = current;
    });
  }

  const api = {
    map,
    renderer,
    layer: null,
    count: 0,
    error: null,
    loaded: null,
    get ready() {
      return done ? true : api.loaded;
    },
    highlightedIds: () => [...highlighted].sort((a, b) => a - b),
    visibleClasses,
    setClassVisible,
    highlight,
    clearHighlight,
    focus,
    view,
    contexts,
    select,
  };

  api.loaded = (async () => {
    try {
      const response = await fetch(element.dataset.annotationsUrl, {
        credentials: 'same-origin',
        headers: { Accept: 'application/geo+json, application/json' },
      });
      if (!response.ok) throw new Error(`loading annotations failed: HTTP ${response.status}`);
      api.layer = draw(await response.json());
      api.count = features.size;
      if (features.size) map.fitBounds(api.layer.getBounds(), { padding: [24, 24] });
    } catch (error) {
      api.error = String(error.message || error);
      const note = L.DomUtil.create('p', 'map-error', element);
      note.setAttribute('role', 'alert');
      note.textContent = 'The annotations could not be loaded.';
    } finally {
      done = true;
      element.dataset.state = api.error ? 'error' : 'ready';
      element.dispatchEvent(new CustomEvent('geosense:map-ready', { detail: api }));
    }
  })();
  return api;
}
