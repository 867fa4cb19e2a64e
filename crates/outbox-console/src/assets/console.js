// The outbox console's one script: the overview's numbers, live.
// The server sends `figures` events (a JSON object from a `data-live` key
// to the text to show); each element with that key gets the new text.
(() => {
  "use strict";
  const live = document.querySelector("[data-live-url]");
  if (!live || !window.EventSource) {
    return;
  }
  const stamp = live.querySelector("[data-live-stamp]");
  const source = new EventSource(live.dataset.liveUrl);
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
    if (stamp) {
      stamp.textContent = `updated ${new Date().toLocaleTimeString()}`;
      stamp.dataset.updates = String(Number(stamp.dataset.updates || "0") + 1);
    }
  });
  source.addEventListener("error", () => {
    if (stamp) {
      stamp.textContent = "reconnecting…";
    }
  });
})();
