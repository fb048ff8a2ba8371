import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  FORMATTERS,
  formatArea,
  formatCredits,
  formatLength,
  formatLinkValue,
  formatOverlap,
  formatPixels,
  formatPosition,
} from '../../static/geosense/format.js';

// Expected texts are what chat/markup/formatting.py prints for the same values
// (tests/browser/test_map_formatting.py checks thousands more against Python itself).

test('lengths use metres below a kilometre and kilometres above', () => {
  assert.equal(formatLength(0.456), '0.46 m');
  assert.equal(formatLength(4.3), '4.3 m');
  assert.equal(formatLength(4), '4 m');
  assert.equal(formatLength(99.97), '100 m');
  assert.equal(formatLength(123.4), '123 m');
  assert.equal(formatLength(1234.5), '1.2 km');
  assert.equal(formatLength(123456), '123 km');
  assert.equal(formatLength(12345678), '12,346 km');
});

test('areas use square metres below a hectare and hectares above', () => {
  assert.equal(formatArea(4.25), '4.2 m²');
  assert.equal(formatArea(850.4), '850 m²');
  assert.equal(formatArea(9999), '9,999 m²');
  assert.equal(formatArea(12500), '1.25 ha');
  assert.equal(formatArea(250000), '25 ha');
  assert.equal(formatArea(3400000), '340 ha');
});

test('overlaps are percentages with a decimal below ten percent', () => {
  assert.equal(formatOverlap(0.42), '42%');
  assert.equal(formatOverlap(0.045), '4.5%');
  assert.equal(formatOverlap(1), '100%');
});

test('exact ties round half to even as Python does', () => {
  assert.equal(formatLength(2.5), '2.5 m');
  assert.equal(formatLength(0.125), '0.12 m');
  assert.equal(formatLength(0.375), '0.38 m');
  assert.equal(formatPixels(2.5), '2 px');
  assert.equal(formatPixels(3.5), '4 px');
  assert.equal(formatCredits(0.125), '0.12 credits');
});

test('negative numbers and negative zero keep their sign', () => {
  assert.equal(formatLength(-4.35), '-4.3 m');
  assert.equal(formatLength(-0.001), '-0 m');
  assert.equal(formatPixels(-0), '-0 px');
});

test('credits are singular only for exactly one', () => {
  assert.equal(formatCredits(1), '1 credit');
  assert.equal(formatCredits(2.5), '2.5 credits');
  assert.equal(formatCredits(0), '0 credits');
});

test('numeric strings are read as Python float() reads them, anything else is a dash', () => {
  assert.equal(formatLength('4.3'), '4.3 m');
  assert.equal(formatLength(' 12 '), '12 m');
  assert.equal(formatLength('.5'), '0.5 m');
  for (const value of ['', 'abc', '0x10', 'nan', 'inf', null, undefined, true, {}, [], NaN, Infinity]) {
    assert.equal(formatLength(value), '—', String(value));
  }
});

test('positions accept objects and GeoJSON-ordered pairs', () => {
  assert.equal(formatPosition({ latitude: 52.52, longitude: 13.405 }), '52.52000° N, 13.40500° E');
  assert.equal(formatPosition({ lat: -33.5, lng: -70.25 }), '33.50000° S, 70.25000° W');
  assert.equal(formatPosition([13.4, 52.5]), '52.50000° N, 13.40000° E');
  assert.equal(formatPosition({ latitude: null, lat: 3, lon: 4 }), '—');
  assert.equal(formatPosition({ lat: 91, lon: 0 }), '—');
  assert.equal(formatPosition([1, 2, 3]), '—');
});

test('link values follow the link type', () => {
  assert.equal(formatLinkValue('distance', 4.3), '4.3 m');
  assert.equal(formatLinkValue('overlap', 0.42), '42%');
  assert.equal(formatLinkValue('other', 3.14159), '3.14');
  assert.deepEqual(Object.keys(FORMATTERS).sort(), ['area', 'credits', 'length', 'overlap', 'pixels', 'position']);
});
