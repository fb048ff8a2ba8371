// The data contexts a question sends about the map: `visibility` (classes shown and hidden),
// `position` (centre, zoom, bounds) and `image` (a PNG of what the user sees: the WebGL
// canvas read right after a frame is drawn, with the link labels painted over it).

import { MAP_CONTEXT_TYPES as CONTEXT_TYPES } from './wire.js';
import { BACKGROUND_COLOR, LINK_COLOR } from './map-style.js';

const IMAGE_MAX_WIDTH = 800;

/**
 * The WebGL canvas as a data URL. The drawing buffer is only whole until the frame is shown
 * (no preserveDrawingBuffer: that costs every frame), so it is read in the `render` event of a
 * frame asked for now.
 */
function canvasPicture(map) {
  return new Promise((resolve) => {
    map.once('render', () => resolve(map.getCanvas().toDataURL('image/png')));
    map.triggerRepaint();
  });
}

/** A PNG of the map as shown, at most IMAGE_MAX_WIDTH wide: background, map, link labels. */
export async function mapImage(map, labels) {
  const source = map.getCanvas();
  const cssWidth = source.clientWidth || source.width;
  const cssHeight = source.clientHeight || source.height;
  const scale = Math.min(1, IMAGE_MAX_WIDTH / Math.max(1, cssWidth));
  const width = Math.max(1, Math.round(cssWidth * scale));
  const height = Math.max(1, Math.round(cssHeight * scale));
  const picture = new Image();
  picture.src = await canvasPicture(map);
  await picture.decode();
  const canvas = document.createElement('canvas');
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext('2d');
  context.fillStyle = BACKGROUND_COLOR;
  context.fillRect(0, 0, width, height);
  context.drawImage(picture, 0, 0, width, height);
  context.scale(scale, scale);
  context.font = '600 12px system-ui, sans-serif';
  context.textAlign = 'center';
  context.textBaseline = 'middle';
  for (const { text, x, y } of labels) {
    context.lineWidth = 3;
    context.strokeStyle = '#ffffff';
    context.strokeText(text, x, y);
    context.fillStyle = LINK_COLOR;
    context.fillText(text, x, y);
  }
  return { png: canvas.toDataURL('image/png'), width, height };
}

/**
 * The requested data contexts of the view, in the order asked, each type once; unknown types
 * are left out. `visibility` → {classes, hidden}; `position` → {center, zoom, bounds};
 * `image` → {png, width, height}.
 *
 * @param {string[]} types
 * @param {{view: () => object, hiddenClasses: () => string[], image: () => Promise<object>}} map
 * @returns {Promise<{type: string, data: object}[]>}
 */
export async function mapContexts(types, { view, hiddenClasses, image }) {
  const wanted = [...new Set(Array.isArray(types) ? types : [])].filter((type) => CONTEXT_TYPES.includes(type));
  const out = [];
  for (const type of wanted) {
    if (type === 'visibility') {
      out.push({ type, data: { classes: view().visible_classes, hidden: hiddenClasses() } });
    } else if (type === 'position') {
      const { center, zoom, bounds } = view();
      out.push({ type, data: { center, zoom, bounds } });
    } else {
      out.push({ type, data: await image() });
    }
  }
  return out;
}
