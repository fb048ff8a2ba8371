import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FADING_ERROR_MS, STATUS_MS, createNotices } from '../../static/geosense/notices.js';
import { fakeClock } from './location-fakes.mjs';

// Just enough DOM for notices.js: elements with dataset, children and listeners.
class Element {
  constructor(tag) {
    this.tag = tag;
    this.dataset = {};
    this.attributes = {};
    this.children = [];
    this.parent = null;
    this.listeners = {};
    this.className = '';
    this.textContent = '';
  }
  setAttribute(name, value) {
    this.attributes[name] = String(value);
  }
  append(...children) {
    for (const child of children) {
      child.parent = this;
      this.children.push(child);
    }
  }
  remove() {
    if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this);
    this.parent = null;
  }
  querySelectorAll(selector) {
    assert.equal(selector, ':scope > .notice');
    return this.children.filter((child) => child.className.split(' ').includes('notice'));
  }
  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }
  fire(type) {
    for (const listener of this.listeners[type] ?? []) listener({ type });
  }
}

function setUp() {
  const clock = fakeClock();
  const container = new Element('div');
  const document = { createElement: (tag) => new Element(tag) };
  const notice = createNotices({
    container,
    document,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
  });
  return { clock, container, notice };
}

const fading = (box) => box.dataset.fading === 'true';

test('a status fades after STATUS_MS and then leaves', async () => {
  const { clock, container, notice } = setUp();
  const box = notice('Wait until the current answer is finished.', { kind: 'status' });
  await clock.advance(STATUS_MS - 1);
  assert.equal(fading(box), false);
  await clock.advance(1);
  assert.equal(fading(box), true);
  await clock.advance(1000);
  assert.deepEqual(container.children, []);
});

for (const [enter, leave] of [
  ['mouseenter', 'mouseleave'],
  ['focusin', 'focusout'],
]) {
  test(`a status being read (${enter}) waits, and fades STATUS_MS after ${leave}`, async () => {
    const { clock, container, notice } = setUp();
    const box = notice('Connected again.', { kind: 'status' });
    await clock.advance(STATUS_MS - 100);
    box.fire(enter);
    await clock.advance(STATUS_MS * 10);
    assert.equal(fading(box), false);
    assert.deepEqual(container.children, [box]);
    box.fire(leave);
    await clock.advance(STATUS_MS - 1); // counted again from the start once left
    assert.equal(fading(box), false);
    await clock.advance(1);
    assert.equal(fading(box), true);
  });
}

test("a turn's error (kept in the transcript) waits while hovered, then fades", async () => {
  const { clock, notice } = setUp();
  const box = notice('The answer stopped: the model is unreachable.', { fade: true });
  box.fire('mouseenter');
  await clock.advance(FADING_ERROR_MS * 2);
  assert.equal(fading(box), false);
  box.fire('mouseleave');
  await clock.advance(FADING_ERROR_MS);
  assert.equal(fading(box), true);
});

test('an error stays until dismissed, hovered or not', async () => {
  const { clock, container, notice } = setUp();
  const box = notice('Not sent: the text is too long.');
  box.fire('mouseenter');
  box.fire('mouseleave');
  await clock.advance(FADING_ERROR_MS * 10);
  assert.equal(fading(box), false);
  assert.equal(clock.pending(), 0);
  const dismiss = box.children.find((child) => child.tag === 'button');
  dismiss.fire('click');
  assert.deepEqual(container.children, []);
});
