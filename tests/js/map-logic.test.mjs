// The map's logic that needs no WebGL: legend model, highlight plan and link lines, labels in
// view and their decluttering, view maths, popup rows.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  declutter,
  highlightPlan,
  hintTexts,
  idsToLocate,
  labelsInView,
  highlightFeatures,
} from '../../static/geosense/map-highlight-plan.js';
import { countsOf, legendModel } from '../../static/geosense/map-legend.js';
import { describeFeature, popupRows } from '../../static/geosense/map-popup.js';
import { classColors } from '../../static/geosense/map-style.js';
import { boundsOf, centreOf, viewOf, wrapLongitude } from '../../static/geosense/map-view.js';

test('the legend lists every class of the counts, sorted, with colour and visibility', () => {
  const counts = countsOf(JSON.parse('{"tree": 9932, "house": 4770, "__proto__": 2, "constructor": 1, "bad": -1, "x": 1.5}'));
  const rows = legendModel(counts, classColors(counts.keys()), new Set(['tree']));

  assert.deepEqual(rows.map((r) => [r.name, r.count, r.visible]), [
    ['__proto__', 2, true],
    ['constructor', 1, true],
    ['house', 4770, true],
    ['tree', 9932, false],
  ]);
  assert.ok(rows.every((row) => /^#[0-9a-f]{6}$/.test(row.color)));
  assert.equal(countsOf(null).size, 0);
});

const BOXES = new Map([
  [1, { box: [0, 0, 2, 2], class: 'tree' }],
  [2, { box: [10, 10, 12, 12], class: 'tree' }],
  [5, { box: [4, 4, 4, 4], class: 'house' }],
  [6, { box: [8, 0, 8, 0], class: 'house' }],
]);

test('a highlight plan splits shown from missing ids and links located ends only', () => {
  const data = { ids: [2, 1, 99, 2, 'x'], links: [5, 6, 5, 1], linkValues: [4.3, 1234.5, 7, null], linkType: 'distance' };
  const plan = highlightPlan(data, BOXES);

  assert.deepEqual(plan.shown, [1, 2]);
  assert.deepEqual(plan.missing, [99]);
  assert.deepEqual(plan.linkTargets, [5, 6]);
  assert.deepEqual([...plan.classes].sort(), ['house', 'tree']);
  assert.deepEqual(plan.links.map((l) => [l.index, l.id, l.target, l.label]), [
    [0, 2, 5, '4.3 m'],
    [1, 1, 6, '1.2 km'],
    [3, 2, 1, null],
  ]);
  assert.deepEqual(plan.links[0].from, [11, 11]);
  assert.deepEqual(plan.links[0].middle, [7.5, 7.5]);
  assert.deepEqual(idsToLocate(data), [2, 1, 99, 5, 6]);
});

test('an overlap plan labels percentages', () => {
  const plan = highlightPlan({ ids: [1], links: [5], linkValues: [0.045], linkType: 'overlap' }, BOXES);
  assert.equal(plan.links[0].label, '4.5%');
});

test('a highlight of 100,000 ids with links is planned in one pass', () => {
  const boxes = new Map();
  const ids = [];
  const links = [];
  for (let i = 1; i <= 100_000; i += 1) {
    boxes.set(i, { box: [i * 1e-5, 0, i * 1e-5, 1e-5], class: i % 2 ? 'tree' : 'house' });
    ids.push(i);
    links.push(((i + 1) % 100_000) + 1);
  }
  const plan = highlightPlan({ ids, links, linkValues: ids.map((i) => i / 10), linkType: 'distance' }, boxes);
  const lines = highlightFeatures(plan.links);
  assert.equal(plan.shown.length, 100_000);
  assert.equal(lines.features.length, 100_000);
  assert.deepEqual(lines.features[0].properties, { index: 0, link: '1-3' });
  assert.equal(lines.features[0].geometry.type, 'LineString');
  const marks = highlightFeatures([], plan.shown.map((id) => [id, boxes.get(id).box])).features;
  assert.equal(marks.length, 100_000);
  assert.deepEqual(marks[1], { type: 'Feature', properties: { id: 2 }, geometry: { type: 'Point', coordinates: [2e-5, 5e-6] } });
});

test('labels in view keep only midpoints inside the bounds, up to a limit', () => {
  const plan = highlightPlan({ ids: [1, 2, 1], links: [5, 6, 2], linkValues: [1, 2, 3] }, BOXES);
  assert.deepEqual(labelsInView(plan.links, [0, 0, 8, 8], 10).map((l) => l.index), [0, 2]);
  assert.deepEqual(labelsInView(plan.links, [-20, -20, 20, 20], 2).map((l) => l.index), [0, 1]);
});

test('declutter hides a label covering one kept before it, and only that', () => {
  const box = (left, top) => ({ left, top, right: left + 40, bottom: top + 14 });
  assert.deepEqual(declutter([box(0, 0), box(10, 5), box(100, 0), box(130, 200)]), [false, true, false, false]);
});

test('attribute hints aligned with ids belong to each id, others to the whole set', () => {
  const { perFeature, overall } = hintTexts({
    ids: [3, 4], areas: [850.4, 12500], cost: 2.5, attributeHints: { areas: 'area', cost: 'credits', nothing: 'area' },
  });
  assert.deepEqual(perFeature.get(4), [['areas', '1.25 ha']]);
  assert.deepEqual(overall, [['cost', '2.5 credits']]);
});

test('the view reports web-map zoom, wrapped centre, clamped bounds and sorted classes', () => {
  const view = viewOf({
    center: { lng: 372.1234567, lat: 52.5 },
    zoom: 16.123,
    bounds: [-190, -95, 13.5, 52.6],
    classes: new Set(['tree', 'house']),
  });
  assert.deepEqual(view, {
    center: { lat: 52.5, lon: 12.123457 },
    zoom: 17.12,
    bounds: [-180, -90, 13.5, 52.6],
    visible_classes: ['house', 'tree'],
  });
  assert.equal(wrapLongitude(180), 180);
  assert.equal(wrapLongitude(-180), -180);
  assert.equal(wrapLongitude(190), -170);
});

test('bounds and centres of boxes', () => {
  assert.deepEqual(boundsOf([[0, 0, 1, 1], [2, -1, 3, 0.5], [NaN, 0, 0, 0]]), [0, -1, 3, 1]);
  assert.equal(boundsOf([]), null);
  assert.deepEqual(centreOf([0, 0, 2, 4]), [1, 2]);
});

test('popup rows follow the geometry: area and perimeter, length, or position', () => {
  const at = { lng: 13.4, lat: 52.5 };
  assert.deepEqual(popupRows({ id: 7, type: 'Polygon', properties: { class: 'house', area_m2: 48, length_m: 28 }, lngLat: at })
    .map(([k]) => k), ['id', 'class', 'area', 'perimeter']);
  assert.deepEqual(popupRows({ id: 8, type: 'LineString', properties: { class: 'road', length_m: 120 }, lngLat: at }, [['gap', '3 m']])
    .map(([k]) => k), ['id', 'class', 'length', 'gap']);
  assert.equal(popupRows({ id: 9, type: 'Point', properties: {}, lngLat: at })[1][1], '—');
  assert.equal(describeFeature({ id: 25, properties: { class: 'pool', area_m2: 48 } }), 'pool 25 · 48 m²');
});
