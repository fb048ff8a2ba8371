// What a highlight draws, worked out without WebGL: which ids are shown or missing, the link
// lines (a GeoJSON source) and their labels, the attribute hints, and which labels fit on
// screen. tests/js/map-highlight-plan.test.mjs checks it in Node; map-highlight.js draws it.

import { FORMATTERS, formatLinkValue } from './format.js';
import { centreOf, contains } from './map-view.js';

/** The integers of `values` (anything else is dropped), or [] when it is not a list. */
export function integers(values) {
  return Array.isArray(values) ? values.filter((value) => Number.isSafeInteger(value)) : [];
}

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
    if (!Object.hasOwn(data, key)) continue;
    const format = FORMATTERS[type] ?? ((value) => String(value));
    const value = data[key];
    const aligned = Array.isArray(value) && value.length === ids.length
      && (type !== 'position' || value.every((item) => item && typeof item === 'object'));
    if (!aligned) {
      overall.push([key, format(value)]);
      continue;
    }
    ids.forEach((id, i) => {
      if (!Number.isSafeInteger(id)) return;
      if (!perFeature.has(id)) perFeature.set(id, []);
      perFeature.get(id).push([key, format(value[i])]);
    });
  }
  return { perFeature, overall };
}

/** Every id a highlight payload names (its ids and link targets), once each. */
export function idsToLocate(data) {
  return [...new Set([...integers(data?.ids), ...integers(data?.links)])];
}

/**
 * The highlight of `data` over the located annotations `boxes` (id → {box, class}):
 * shown and missing ids (sorted), link targets that are not highlighted themselves, and one
 * link per ids[i] → links[i] with both ends located: its index, ends, midpoint and label text.
 *
 * @param {object} data the highlight block's data
 * @param {Map<number, {box: number[], class: string}>} boxes
 */
export function highlightPlan(data, boxes) {
  const payload = data && typeof data === 'object' ? data : {};
  const ids = Array.isArray(payload.ids) ? payload.ids : [];
  const unique = [...new Set(integers(ids))].sort((a, b) => a - b);
  const shown = unique.filter((id) => boxes.has(id));
  const missing = unique.filter((id) => !boxes.has(id));
  const highlighted = new Set(shown);
  const targets = Array.isArray(payload.links) ? payload.links : [];
  const values = Array.isArray(payload.linkValues) ? payload.linkValues : [];
  const linkTargets = new Set();
  const links = [];
  ids.forEach((id, index) => {
    const target = targets[index];
    if (!boxes.has(id) || !Number.isSafeInteger(target) || !boxes.has(target)) return;
    if (!highlighted.has(target)) linkTargets.add(target);
    const from = centreOf(boxes.get(id).box);
    const to = centreOf(boxes.get(target).box);
    const value = values[index];
    const label = value === undefined || value === null ? null : formatLinkValue(payload.linkType, value);
    links.push({ index, id, target, from, to, middle: [(from[0] + to[0]) / 2, (from[1] + to[1]) / 2], label });
  });
  const classes = new Set([...highlighted, ...linkTargets].map((id) => boxes.get(id).class));
  return { shown, missing, linkTargets: [...linkTargets].sort((a, b) => a - b), links, classes };
}

/**
 * The highlight's GeoJSON: a line per link (properties index, link "id-target") and a mark per
 * highlighted id at its box centre (property id), which shows it at zooms where the tiles
 * fold small shapes into count points.
 *
 * @param {{index: number, id: number, target: number, from: number[], to: number[]}[]} links
 * @param {[number, number[]][]} [marks] [id, box] pairs
 */
export function highlightFeatures(links, marks = []) {
  const lines = links.map((link) => ({
    type: 'Feature',
    properties: { index: link.index, link: `${link.id}-${link.target}` },
    geometry: { type: 'LineString', coordinates: [link.from, link.to] },
  }));
  const points = marks.map(([id, box]) => ({
    type: 'Feature',
    properties: { id },
    geometry: { type: 'Point', coordinates: centreOf(box) },
  }));
  return { type: 'FeatureCollection', features: [...lines, ...points] };
}

/** The labelled links whose midpoint is inside `bounds` [w, s, e, n], at most `limit`. */
export function labelsInView(links, bounds, limit) {
  const out = [];
  for (const link of links) {
    if (link.label === null || !contains(bounds, link.middle)) continue;
    out.push(link);
    if (out.length >= limit) break;
  }
  return out;
}

/**
 * Which of these screen boxes ({left, top, right, bottom}) to hide so that none covers one
 * kept before it: a grid of `cell`-pixel cells keeps this linear in the number of boxes.
 *
 * @returns {boolean[]} hidden, index by index
 */
export function declutter(boxes, cell = 64) {
  const grid = new Map();
  const overlaps = (a, b) => !(a.right < b.left || a.left > b.right || a.bottom < b.top || a.top > b.bottom);
  return boxes.map((box) => {
    const keys = [];
    for (let x = Math.floor(box.left / cell); x <= Math.floor(box.right / cell); x += 1) {
      for (let y = Math.floor(box.top / cell); y <= Math.floor(box.bottom / cell); y += 1) keys.push(`${x},${y}`);
    }
    if (keys.some((key) => (grid.get(key) ?? []).some((other) => overlaps(box, other)))) return true;
    for (const key of keys) grid.set(key, [...(grid.get(key) ?? []), box]);
    return false;
  });
}
