// forgeflow admin pages: optional enhancements. Every page works without this file.
// - forms with data-confirm ask before they submit;
// - regions marked data-live are refreshed in place when the audit log moves
//   (the page carries the change marker it was rendered at in <body data-stamp>).
(function () {
  "use strict";

  document.addEventListener("submit", function (ev) {
    var message = ev.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) {
      ev.preventDefault();
    }
  });

  var stamp = document.body.getAttribute("data-stamp");
  if (!stamp || !document.querySelector("[data-live][id]")) {
    return;
  }
  var busy = false;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live][id]").forEach(function (region) {
      var next = fresh.getElementById(region.id);
      // Never pull a form from under someone typing in it (a focused summary or link
      // is no reason to hold a region back).
      var typing = document.activeElement &&
        document.activeElement.matches("input, textarea, select, [contenteditable]");
      if (!next || (typing && region.contains(document.activeElement))) {
        return;
      }
      if (next.innerHTML !== region.innerHTML) {
        // Keep what the reader opened or closed (a transcript entry's output) as it was.
        var shown = {};
        region.querySelectorAll("details[id]").forEach(function (d) {
          shown[d.id] = d.open;
        });
        region.innerHTML = next.innerHTML;
        region.querySelectorAll("details[id]").forEach(function (d) {
          if (Object.prototype.hasOwnProperty.call(shown, d.id)) {
            d.open = shown[d.id];
          }
        });
      }
    });
    return fresh.body.getAttribute("data-stamp");
  }

  function poll() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    var url = document.body.getAttribute("data-stamp-url") || "/ui/live";
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.redirected) {
          window.location.reload(); // the session ended: show the sign-in page
        }
        if (r.redirected || !r.ok) {
          throw new Error("no marker");
        }
        return r.json();
      })
      .then(function (data) {
        if (data.stamp === stamp) {
          return null;
        }
        return fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
          .then(function (r) {
            if (r.redirected || !r.ok) {
              throw new Error("page gone");
            }
            return r.text();
          })
          .then(function (html) {
            stamp = swap(html) || data.stamp;
            document.body.setAttribute("data-stamp", stamp);
          });
      })
      .catch(function () { /* try again on the next tick */ })
      .then(function () { busy = false; });
  }

  window.setInterval(poll, 1000);
})();
