// The chat session the panel shows: created on first use, and its allow_backend_tools toggle.

import { errorText, request } from './http.js';

/**
 * @param {{
 *   panel: HTMLElement,                    the #chat-panel (data-session-id)
 *   notice: (text: string) => void,
 *   onCreated?: (id: string) => Promise<void> | void,  a new session exists (the socket binds it)
 *   document?: Document,
 * }} options
 */
export function createSessionState({ panel, notice, onCreated = () => {}, document = globalThis.document }) {
  const toggle = panel.querySelector('#allow-backend-tools');
  let id = panel.dataset.sessionId || null;

  /** The session's id, creating the session first when the panel shows a new conversation. */
  async function ensure() {
    if (id) return id;
    const response = await request('/api/sessions', { method: 'POST', body: {}, document });
    if (!response.ok) throw new Error(await errorText(response));
    id = (await response.json()).id;
    panel.dataset.sessionId = id;
    if (toggle) toggle.disabled = false;
    history.replaceState(null, '', `/chat/${id}/`);
    await onCreated(id); // the socket is bound and the tools registered before the first turn
    return id;
  }

  async function setAllowBackendTools(wanted) {
    try {
      await ensure();
      const response = await request(`/api/sessions/${id}`, {
        method: 'PATCH',
        body: { allow_backend_tools: wanted },
        document,
      });
      if (!response.ok) throw new Error(await errorText(response));
      toggle.checked = (await response.json()).allow_backend_tools;
    } catch (error) {
      toggle.checked = !wanted;
      notice(`The setting was not changed: ${error.message}`);
    }
  }

  toggle?.addEventListener('change', () => setAllowBackendTools(toggle.checked));

  return {
    get id() {
      return id;
    },
    ensure,
    /** What a live update said changed beside the transcript: the toggle's state. */
    applyState(response) {
      const allow = response.headers.get('X-GeoSense-Allow-Backend-Tools');
      if (allow !== null && toggle) toggle.checked = allow === 'true';
    },
  };
}
