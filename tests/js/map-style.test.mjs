import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  annotationLayers,
  classColorExpression,
  classColors,
  dataBounds,
  idFilter,
  layerFilter,
  mapStyle,
  visibleClassFilter,
} from '../../static/geosense/map-style.js';

/** A tiny evaluator of the expressions map-style.js writes (case, ==, literal, get, match, in, !, all). */
function evaluate(expression, properties) {
  if (!Array.isArray(expression)) return expression;
  const [op, ...args] = expression;
  const value = (e) => evaluate(e, properties);
  switch (op) {
    case 'literal': return args[0];
    case 'get': return Object.hasOwn(properties, args[0]) ? properties[args[0]] : null;
    case 'to-number': return Number(value(args[0]) ?? args[1]);
    case '==': return value(args[0]) === value(args[1]);
    case '!': return !value(args[0]);
    case 'all': return args.every((a) => value(a));
    case 'in': return value(args[1]).includes(value(args[0]));
    case 'case': {
      for (let i = 0; i < args.length - 1; i += 2) if (value(args[i])) return value(args[i + 1]);
      return value(args[args.length - 1]);
    }
    case 'match': {
      const input = value(args[0]);
      for (let i = 1; i < args.length - 1; i += 2) {
        const labels = Array.isArray(args[i]) ? args[i] : [args[i]];
        if (labels.includes(input)) return value(args[i + 1]);
      }
      return value(args[args.length - 1]);
    }
    default: throw new Error(`no evaluator for ${op}`);
  }
}

test('known classes keep their colour and others take distinct palette colours', () => {
  const colors = classColors(['tree', 'house', 'shed', 'kiosk', 'tree']);
  assert.equal(colors.get('tree'), '#2e8b57');
  assert.equal(colors.get('house'), '#c0504d');
  assert.equal(colors.size, 4);
  assert.notEqual(colors.get('shed'), colors.get('kiosk'));
  assert.deepEqual(classColors(['kiosk', 'shed']), classColors(['shed', 'kiosk']));
});

test('__proto__, constructor and toString get colours of their own (issue 12 item 10)', () => {
  const names = ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'tree'];
  const colors = classColors(names);
  const expression = classColorExpression(colors);

  assert.equal(colors.size, names.length);
  for (const name of names) {
    assert.match(colors.get(name), /^#[0-9a-f]{6}$/);
    assert.equal(evaluate(expression, { class: name }), colors.get(name), name);
  }
  // MapLibre's `match` keeps labels as plain-object keys, where these names collide:
  // the colour expression compares with == instead.
  assert.equal(JSON.stringify(expression).includes('"match"'), false);
  assert.equal(evaluate(expression, { class: 'unknown' }), '#7f7f7f');
});

test('a hidden class is filtered out, others stay, whatever their names', () => {
  const filter = visibleClassFilter(new Set(['tree', '__proto__']));
  assert.equal(evaluate(filter, { class: 'tree' }), false);
  assert.equal(evaluate(filter, { class: '__proto__' }), false);
  assert.equal(evaluate(filter, { class: 'house' }), true);
  assert.equal(visibleClassFilter(new Set()), true);
});

test('the id filter matches exactly the ids given, deduplicated, for 100,000 ids', () => {
  const ids = Array.from({ length: 100_000 }, (_, i) => i * 3 + 1);
  const filter = idFilter([...ids, ids[0], 2.5, 'x']);
  assert.equal(filter[0], 'match');
  assert.equal(filter[2].length, 100_000);
  assert.equal(evaluate(filter, { id: 4 }), true);
  assert.equal(evaluate(filter, { id: 5 }), false);
  assert.equal(idFilter([]), false);
});

test('overlays draw nothing without ids and narrow to ids and visible classes with them', () => {
  const layers = annotationLayers(classColors(['tree']));
  const highlight = layers.find((layer) => layer.id === 'ann-highlight-line');
  const fill = layers.find((layer) => layer.id === 'ann-fill');
  assert.equal(layerFilter(highlight, { classes: true, ids: false }), false);
  const narrowed = layerFilter(highlight, { classes: visibleClassFilter(new Set(['house'])), ids: idFilter([7]) });
  assert.deepEqual(narrowed[0], 'all');
  assert.deepEqual(layerFilter(fill, { classes: true }), fill.filter);
});

test('the style has the annotation source with promoted ids, and one base layer', () => {
  const tiles = { tiles: ['/tiles/annotations/{z}/{x}/{y}.mvt'], minzoom: 0, maxzoom: 22 };
  const demo = mapStyle(tiles, classColors(['tree']));
  const raster = mapStyle(tiles, classColors(['tree']), { rasterUrl: 'https://t.example/{z}/{x}/{y}.png' });
  const index = (style, id) => style.layers.findIndex((layer) => layer.id === id);

  assert.equal(demo.sources.annotations.promoteId, 'id');
  assert.deepEqual(demo.sources.annotations.tiles, tiles.tiles);
  assert.equal(demo.sources.base, undefined);
  assert.deepEqual(demo.layers.filter((l) => l['source-layer'] === 'base').map((l) => l.id), ['base-blocks', 'base-parks', 'base-lots']);
  assert.ok(index(demo, 'base-lots') < index(demo, 'ann-fill'));
  assert.equal(raster.sources.base.type, 'raster');
  assert.equal(raster.layers[1].id, 'base-raster');
  assert.equal(raster.layers.some((l) => l['source-layer'] === 'base'), false);
  assert.ok(demo.layers.every((layer) => !('overlay' in layer)));
});

test('the annotation source asks no tile outside the data, and a map without data has no bounds', () => {
  const tiles = { tiles: ['/tiles/annotations/{z}/{x}/{y}.mvt'], total: 3, bounds: [-118.6, 34.1, -118.3, 34.2] };
  assert.deepEqual(mapStyle(tiles, classColors(['tree'])).sources.annotations.bounds, [-118.6, 34.1, -118.3, 34.2]);
  assert.equal('bounds' in mapStyle({ ...tiles, total: 0 }, classColors([])).sources.annotations, false);
  assert.equal('bounds' in mapStyle({ tiles: tiles.tiles }, classColors([])).sources.annotations, false);

  assert.deepEqual(dataBounds(tiles), [-118.6, 34.1, -118.3, 34.2]);
  assert.notEqual(dataBounds(tiles), tiles.bounds); // a copy: the style keeps its own
  for (const bounds of [null, [1, 2, 3], [0, 0, 'x', 1], [0, 0, Infinity, 1], [2, 0, 1, 1], [0, 2, 1, 1]]) {
    assert.equal(dataBounds({ total: 1, bounds }), null, JSON.stringify(bounds));
  }
  assert.equal(dataBounds(null), null);
});
