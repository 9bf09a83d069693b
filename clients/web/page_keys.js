/**
 * The page's keyboard shortcuts and its settings form: what the page binds once, at start.
 *
 * Shortcuts (not while typing in a text field, nor with Ctrl/Meta/Alt): Space holds
 * push-to-talk while the stage has focus, "/" focuses the prompt box, "P" pauses or resumes.
 * The settings form stores the ICE servers and the API key for the next session.
 */

import { isTextTarget } from "./action_input.js";
import { parseIceServers, storeSettings } from "./config.js";

const $ = (id) => document.getElementById(id);

/**
 * `talk()`: the session's PushToTalk (or null), `spaceOwners()`: the elements Space talks on,
 * `focusPrompt()`, `togglePause()`.
 */
export function bindShortcuts({ talk, spaceOwners, focusPrompt, togglePause }) {
  window.addEventListener("keydown", (event) => {
    if (isTextTarget(event.target) || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.code === "Space" && spaceOwners().includes(event.target)) {
      event.preventDefault();
      if (!event.repeat) talk()?.press();
    } else if (event.key === "/") {
      event.preventDefault();
      focusPrompt();
    } else if ((event.key === "p" || event.key === "P") && !event.repeat) {
      togglePause();
    }
  });
  window.addEventListener("keyup", (event) => {
    if (event.code === "Space" && talk()?.talking && event.target !== $("talk")) {
      event.preventDefault();
      talk().release();
    }
  });
  window.addEventListener("blur", () => talk()?.release());
}

/** The settings form (#settings-form): shows `config`'s ICE servers and API key, saves edits. */
export function bindSettingsForm(config, api) {
  const ice = $("settings-ice");
  const key = $("settings-key");
  ice.value = config.iceText;
  key.value = config.apiKey;
  $("settings-form").addEventListener("submit", (event) => {
    event.preventDefault();
    try {
      config.iceServers = parseIceServers(ice.value);
    } catch (err) {
      $("settings-status").textContent = err.message;
      return;
    }
    config.iceText = ice.value;
    config.apiKey = key.value;
    api.apiKey = key.value;
    storeSettings({ ice: ice.value, key: key.value });
    $("settings-status").textContent = "Saved; used by the next session.";
  });
}
