// The annotation map: draws the annotations of /api/annotations on a Leaflet map, one style
// per class. Shapes go through Leaflet's SVG renderer, so each one is a DOM element carrying
// data-annotation-id and data-annotation-class that tests and other modules can find.
// Text from the data (class names) only ever goes into the page as textContent.

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
  if (props.area_m2) parts.push(`${Math.round(props.area_m2).toLocaleString('en')} m²`);
  else if (props.length_m) parts.push(`${Math.round(props.length_m).toLocaleString('en')} m`);
  return parts.join(' · ');
}

function styleFor(color, geometryType) {
  if (geometryType.includes('LineString')) {
    return { color, weight: 3, opacity: 0.9, fill: false };
  }
  if (geometryType.includes('Point')) {
    return { color: '#ffffff', weight: 1, fillColor: color, fillOpacity: 0.95, radius: 5 };
  }
  return { color, weight: 1.5, opacity: 0.9, fillColor: color, fillOpacity: 0.35 };
}

function elementsOf(layer) {
  if (typeof layer.getElement === 'function') {
    const element = layer.getElement();
    return element ? [element] : [];
  }
  const elements = [];
  if (typeof layer.eachLayer === 'function') {
    layer.eachLayer((child) => elements.push(...elementsOf(child)));
  }
  return elements;
}

function legendControl(L, counts, colors) {
  const legend = L.control({ position: 'bottomright' });
  legend.onAdd = () => {
    const box = L.DomUtil.create('div', 'map-legend');
    box.setAttribute('aria-label', 'Classes on the map');
    for (const [name, count] of [...counts].sort((a, b) => a[0].localeCompare(b[0]))) {
      const row = L.DomUtil.create('div', 'map-legend-row', box);
      const swatch = L.DomUtil.create('span', 'map-legend-swatch', row);
      swatch.style.background = colors.get(name);
      const label = L.DomUtil.create('span', 'map-legend-label', row);
      label.textContent = `${name} (${count})`;
    }
    return box;
  };
  return legend;
}

/**
 * Draws a GeoJSON FeatureCollection of annotations on `map` and records every drawn feature.
 *
 * @returns {{layer: object, byId: Map<string, object>, counts: Map<string, number>}}
 */
export function drawAnnotations(L, map, collection, renderer) {
  const features = collection.features || [];
  const colors = classColors(features.map((f) => f.properties?.class ?? ''));
  const byId = new Map();
  const counts = new Map();
  const layer = L.geoJSON(collection, {
    renderer,
    style: (feature) => styleFor(colors.get(feature.properties?.class ?? ''), feature.geometry.type),
    pointToLayer: (feature, latlng) =>
      L.circleMarker(latlng, {
        renderer,
        ...styleFor(colors.get(feature.properties?.class ?? ''), 'Point'),
      }),
    onEachFeature: (feature, featureLayer) => {
      byId.set(String(feature.id), featureLayer);
      const name = feature.properties?.class ?? '';
      counts.set(name, (counts.get(name) || 0) + 1);
      featureLayer.bindTooltip(() => {
        const text = document.createElement('span');
        text.textContent = describeFeature(feature);
        return text;
      }, { sticky: true });
    },
  }).addTo(map);
  for (const [id, featureLayer] of byId) {
    const name = featureLayer.feature.properties?.class ?? '';
    for (const element of elementsOf(featureLayer)) {
      element.setAttribute('data-annotation-id', id);
      element.setAttribute('data-annotation-class', name);
    }
  }
  legendControl(L, counts, colors).addTo(map);
  return { layer, byId, counts };
}

/**
 * Mounts the map in `element` and starts loading the annotations. Returns at once with a state
 * object (the page keeps it as `window.geosenseMap`) whose `ready` turns true when the
 * annotations are drawn or the load failed (`error` then says why); `loaded` is that promise.
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

  const state = {
    map,
    renderer,
    layer: null,
    byId: new Map(),
    counts: new Map(),
    count: 0,
    ready: false,
    error: null,
    loaded: null,
  };

  state.loaded = (async () => {
    try {
      const response = await fetch(element.dataset.annotationsUrl, {
        credentials: 'same-origin',
        headers: { Accept: 'application/geo+json, application/json' },
      });
      if (!response.ok) throw new Error(`loading annotations failed: HTTP ${response.status}`);
      const drawn = drawAnnotations(L, map, await response.json(), renderer);
      Object.assign(state, drawn, { count: drawn.byId.size });
      if (drawn.byId.size) map.fitBounds(drawn.layer.getBounds(), { padding: [24, 24] });
    } catch (error) {
      state.error = String(error.message || error);
      const note = L.DomUtil.create('p', 'map-error', element);
      note.setAttribute('role', 'alert');
      note.textContent = 'The annotations could not be loaded.';
    } finally {
      state.ready = true;
      element.dataset.state = state.error ? 'error' : 'ready';
      element.dispatchEvent(new CustomEvent('geosense:map-ready', { detail: state }));
    }
    return state;
  })();
  return state;
}
