// View maths of the map, without WebGL: what map_get_view and the position context report,
// and the bounds of annotation boxes. tests/js/map-view.test.mjs checks it in Node.

/**
 * MapLibre draws 512-pixel tiles, so its zoom is one less than the web-map zoom of 256-pixel
 * tiles (XYZ URLs, Leaflet) that map_get_view has always reported: the view adds this.
 */
export const ZOOM_OFFSET = 1;

const round = (value, digits) => Number(value.toFixed(digits));
const clamp = (value, low, high) => Math.min(high, Math.max(low, value));

/** A longitude wrapped into [-180, 180). */
export function wrapLongitude(lon) {
  const wrapped = ((((lon + 180) % 360) + 360) % 360) - 180;
  return wrapped === -180 && lon > 0 ? 180 : wrapped;
}

/**
 * The view as map_get_view answers it: center {lat, lon}, web-map zoom, bounds
 * [minLon, minLat, maxLon, maxLat] clamped to the world, visible classes sorted.
 *
 * @param {{center: {lng: number, lat: number}, zoom: number,
 *          bounds: [number, number, number, number], classes: Iterable<string>}} raw
 */
export function viewOf({ center, zoom, bounds, classes }) {
  const [west, south, east, north] = bounds;
  return {
    center: { lat: round(clamp(center.lat, -90, 90), 6), lon: round(clamp(wrapLongitude(center.lng), -180, 180), 6) },
    zoom: round(zoom + ZOOM_OFFSET, 2),
    bounds: [
      round(clamp(west, -180, 180), 6),
      round(clamp(south, -90, 90), 6),
      round(clamp(east, -180, 180), 6),
      round(clamp(north, -90, 90), 6),
    ],
    visible_classes: [...classes].sort(),
  };
}

/** The box [w, s, e, n] around all `boxes`, or null when there is none. */
export function boundsOf(boxes) {
  let out = null;
  for (const [w, s, e, n] of boxes) {
    if (![w, s, e, n].every(Number.isFinite)) continue;
    if (!out) out = [w, s, e, n];
    else out = [Math.min(out[0], w), Math.min(out[1], s), Math.max(out[2], e), Math.max(out[3], n)];
  }
  return out;
}

/** The centre [lon, lat] of a box: where a link line ends (as Leaflet's bounds centre). */
export function centreOf([w, s, e, n]) {
  return [(w + e) / 2, (s + n) / 2];
}

/** Whether [lon, lat] lies in the box [w, s, e, n]. */
export function contains([w, s, e, n], [lon, lat]) {
  return lon >= w && lon <= e && lat >= s && lat <= n;
}
