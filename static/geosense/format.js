// Human formatting of measures on the page: the same text the server's markup renders
// (chat/markup/formatting.py), so a link label on the map and the chip in the transcript agree.
// tests/formatting_cases.json is the table both sides format (tests/js/format.test.mjs here,
// tests/chat/test_formatting.py there, which also compares thousands of generated values).
// Python rounds exact ties half-to-even and Number#toFixed rounds them up; `fixed` follows Python.

const NUMBER_TEXT = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const DASH = '—';

/** A finite number from a number or numeric string (as Python's float() reads it), else null. */
function toNumber(value) {
  let number = null;
  if (typeof value === 'number') number = value;
  else if (typeof value === 'string' && NUMBER_TEXT.test(value.trim())) number = Number(value.trim());
  return number !== null && Number.isFinite(number) ? number : null;
}

/**
 * `number` with `decimals` digits after the point, rounded as Python's format() does (exact
 * binary value, ties to even), with a leading '-' for negative numbers including -0.
 */
function fixed(number, decimals) {
  const sign = number < 0 || Object.is(number, -0) ? '-' : '';
  const size = Math.abs(number);
  let text = size.toFixed(decimals);
  if (size < 1e21) {
    const exact = size.toFixed(100);
    const point = exact.indexOf('.');
    const next = exact[point + 1 + decimals];
    const tie = next === '5' && /^0*$/.test(exact.slice(point + 2 + decimals));
    if (tie) {
      const down = exact.slice(0, point + (decimals ? 1 + decimals : 0));
      const lastDigit = Number(down[down.length - 1]);
      if (lastDigit % 2 === 0) text = down;
    }
  }
  return sign + text;
}

/** Round to `decimals`, group thousands with commas, drop trailing zeros and a bare point. */
function trim(number, decimals) {
  let text = fixed(number, decimals);
  const sign = text.startsWith('-') ? '-' : '';
  if (sign) text = text.slice(1);
  let [whole, fraction] = text.split('.');
  whole = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  if (fraction !== undefined) fraction = fraction.replace(/0+$/, '');
  return sign + whole + (fraction ? `.${fraction}` : '');
}

/** Metres as `0.45 m`, `4.3 m`, `123 m`, `1.2 km`. */
export function formatLength(value) {
  const metres = toNumber(value);
  if (metres === null) return DASH;
  const size = Math.abs(metres);
  if (size < 1) return `${trim(metres, 2)} m`;
  if (size < 100) return `${trim(metres, 1)} m`;
  if (size < 1000) return `${trim(metres, 0)} m`;
  if (size < 100000) return `${trim(metres / 1000, 1)} km`;
  return `${trim(metres / 1000, 0)} km`;
}

/** Square metres below one hectare (`850 m²`), hectares above (`1.25 ha`, `340 ha`). */
export function formatArea(value) {
  const squareMetres = toNumber(value);
  if (squareMetres === null) return DASH;
  const size = Math.abs(squareMetres);
  if (size < 10) return `${trim(squareMetres, 1)} m²`;
  if (size < 10000) return `${trim(squareMetres, 0)} m²`;
  const hectares = squareMetres / 10000;
  if (size < 100000) return `${trim(hectares, 2)} ha`;
  if (size < 1000000) return `${trim(hectares, 1)} ha`;
  return `${trim(hectares, 0)} ha`;
}

/** An intersection fraction in [0, 1] as a percentage: `42%`, `4.5%`. */
export function formatOverlap(value) {
  const fraction = toNumber(value);
  if (fraction === null) return DASH;
  const percent = fraction * 100;
  return `${trim(percent, Math.abs(percent) < 10 ? 1 : 0)}%`;
}

/** `1 credit`, `2.5 credits`. */
export function formatCredits(value) {
  const amount = toNumber(value);
  if (amount === null) return DASH;
  return `${trim(amount, 2)} ${amount === 1 ? 'credit' : 'credits'}`;
}

export function formatPixels(value) {
  const pixels = toNumber(value);
  return pixels === null ? DASH : `${trim(pixels, 0)} px`;
}

/**
 * Latitude/longitude with five decimals (about a metre): `52.52000° N, 13.40500° E`, from
 * `{latitude, longitude}` / `{lat, lon|lng}` objects or GeoJSON-ordered `[lon, lat]` pairs.
 */
export function formatPosition(value) {
  let lat = null;
  let lon = null;
  if (Array.isArray(value)) {
    if (value.length === 2) [lon, lat] = [toNumber(value[0]), toNumber(value[1])];
  } else if (value && typeof value === 'object') {
    const pick = (...keys) => {
      const key = keys.find((name) => name in value);
      return key === undefined ? null : toNumber(value[key]);
    };
    lat = pick('latitude', 'lat');
    lon = pick('longitude', 'lon', 'lng');
  }
  if (lat === null || lon === null || Math.abs(lat) > 90 || Math.abs(lon) > 180) return DASH;
  const north = lat >= 0 ? 'N' : 'S';
  const east = lon >= 0 ? 'E' : 'W';
  return `${fixed(Math.abs(lat), 5)}° ${north}, ${fixed(Math.abs(lon), 5)}° ${east}`;
}

/** The formatter for each attribute hint type of a highlight payload, and for link types. */
export const FORMATTERS = Object.freeze({
  length: formatLength,
  area: formatArea,
  overlap: formatOverlap,
  credits: formatCredits,
  pixels: formatPixels,
  position: formatPosition,
});

/** A link value as text: `distance` → length, `overlap` → percentage, else the plain number. */
export function formatLinkValue(linkType, value) {
  if (linkType === 'distance') return formatLength(value);
  if (linkType === 'overlap') return formatOverlap(value);
  const number = toNumber(value);
  return number === null ? DASH : trim(number, 2);
}
