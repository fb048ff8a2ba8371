// The page's requests to its own server: JSON with the CSRF token, and HTML fragments.

/** The CSRF token the page carries in `<body hx-headers>` (htmx sends it the same way). */
export function csrfToken(document = globalThis.document) {
  try {
    return JSON.parse(document.body.getAttribute('hx-headers') || '{}')['x-csrftoken'] || '';
  } catch {
    return '';
  }
}

/**
 * A same-origin request with the CSRF token; `body` is sent as JSON.
 *
 * @param {string} url
 * @param {{method?: string, body?: object, document?: Document}} [options]
 * @returns {Promise<Response>}
 */
export function request(url, { method = 'GET', body, document = globalThis.document } = {}) {
  const headers = { 'X-CSRFToken': csrfToken(document), Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  return fetch(url, {
    method,
    headers,
    credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

/** The `{"error"}` text of a refused request, or its status. */
export async function errorText(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === 'string') return body.error;
  } catch {
    /* not JSON: fall through to the status */
  }
  return `the server answered ${response.status}`;
}

/** The first element of a server-rendered HTML fragment, or null when the request failed. */
export async function fetchFragment(url, { document = globalThis.document } = {}) {
  const response = await fetch(url, { credentials: 'same-origin' });
  if (!response.ok) return { response, element: null };
  const template = document.createElement('template');
  template.innerHTML = (await response.text()).trim();
  return { response, element: template.content.firstElementChild };
}
