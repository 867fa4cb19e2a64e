// The outbox console's one script: the parts of a page that follow the
// server live. The server sends `figures` events (a JSON object from a
// `data-live` key to the text to show; each element with that key gets
// the new text), `fragments` events (a JSON object from a `data-live-html`
// key to {version, html}; the element is replaced when its version
// differs, so an answer being typed is kept until the run changes), and
// `done` when there is nothing more to follow.
(() => {
  "use strict";
  const live = document.querySelector("[data-live-url]");
  if (!live || !window.EventSource) {
    return;
  }
  const stamp = live.querySelector("[data-live-stamp]");
  const source = new EventSource(live.dataset.liveUrl);
  const updated = () => {
    if (stamp) {
      stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
      stamp.dataset.updates = String(Number(stamp.dataset.updates || "0") + 1);
    }
  };
  source.addEventListener("figures", (event) => {
    const figures = JSON.parse(event.data);
    for (const [key, text] of Object.entries(figures)) {
      for (const element of document.querySelectorAll(`[data-live="${CSS.escape(key)}"]`)) {
        if (element.textContent !== text) {
          element.textContent = text;
          element.classList.add("changed");
          setTimeout(() => element.classList.remove("changed"), 800);
        }
      }
    }
    updated();
  });
  source.addEventListener("fragments", (event) => {
    const fragments = JSON.parse(event.data);
    for (const [key, fragment] of Object.entries(fragments)) {
      for (const element of document.querySelectorAll(`[data-live-html="${CSS.escape(key)}"]`)) {
        if (element.dataset.liveVersion !== fragment.version) {
          element.innerHTML = fragment.html;
          element.dataset.liveVersion = fragment.version;
        }
      }
    }
    updated();
  });
  source.addEventListener("done", () => {
    source.close();
    if (stamp) {
      stamp.textContent = "ended: nothing more to follow";
      stamp.dataset.ended = "true";
    }
  });
  source.addEventListener("error", () => {
    if (stamp && source.readyState !== EventSource.CLOSED) {
      stamp.textContent = "reconnecting…";
    }
  });
})();
