// The popup of a clicked annotation and the hover text: id, class and the measures the tile
// carries (area and perimeter of a shape, length of a line, position of a point), plus the
// highlight's hints for that id. Text only ever goes in as textContent.

import { formatArea, formatLength, formatPosition } from './format.js';

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

/**
 * The popup's rows as [measure, text] pairs.
 *
 * @param {{id: number, type: string, properties: object, lngLat: {lng: number, lat: number}}} feature
 * @param {[string, string][]} hints
 */
export function popupRows({ id, type, properties, lngLat }, hints = []) {
  const name = properties.class;
  const rows = [['id', String(id)], ['class', name || '—']];
  if (type.includes('Polygon')) {
    rows.push(['area', formatArea(properties.area_m2)], ['perimeter', formatLength(properties.length_m)]);
  } else if (type.includes('LineString')) {
    rows.push(['length', formatLength(properties.length_m)]);
  } else {
    rows.push(['position', formatPosition({ lat: lngLat.lat, lon: lngLat.lng })]);
  }
  return [...rows, ...hints];
}

/** The popup's content element (data-testid="annotation-popup"). */
export function popupContent(document, feature, hints) {
  const box = document.createElement('div');
  box.className = 'gs-popup';
  box.setAttribute('data-testid', 'annotation-popup');
  const title = document.createElement('strong');
  const name = document.createElement('bdi');
  name.textContent = feature.properties.class || 'annotation';
  title.append(name, ` ${feature.id}`);
  const list = document.createElement('dl');
  for (const [key, value] of popupRows(feature, hints)) {
    const row = document.createElement('div');
    row.className = 'gs-popup-row';
    row.setAttribute('data-measure', key);
    const term = document.createElement('dt');
    term.textContent = key;
    const text = document.createElement('dd');
    text.textContent = value;
    row.append(term, text);
    list.appendChild(row);
  }
  box.append(title, list);
  return box;
}
