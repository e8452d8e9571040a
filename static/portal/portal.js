// Behaviour every page shares, wired from data-* attributes because the CSP runs no inline handlers.
"use strict";

// A form with data-confirm asks before it is sent: removing a member, cancelling a request,
// releasing a pool cannot be undone.
document.addEventListener("submit", function (event) {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

// A select with data-submit-on-change (the language picker) sends its form at once;
// without JavaScript the form's own button, shown by <noscript>, does it.
document.addEventListener("change", function (event) {
  const field = event.target;
  if (field instanceof HTMLSelectElement && field.form && "submitOnChange" in field.dataset) {
    field.form.submit();
  }
});

// A region with an id and data-refresh="N" shows work in between (a request waiting, a pool provisioning):
// while the tab is visible, the page is fetched again every N seconds and the region swapped for its fresh
// copy. The server leaves the attribute off once nothing there is in between, so refreshing stops by
// itself. A swap waits while someone types in the region or has a <details> in it open. Without
// JavaScript, reloading the page shows the same. A swapped region gets a "portal:refreshed" event.
(function () {
  const FEWEST_SECONDS = 2;

  function interval(region) {
    const seconds = parseInt(region.dataset.refresh, 10);
    return Number.isFinite(seconds) ? Math.max(seconds, FEWEST_SECONDS) : 0;
  }

  function inUse(region) {
    const focused = document.activeElement;
    if (focused && region.contains(focused) && focused.matches("input, select, textarea, [contenteditable]")) {
      return true;
    }
    return region.querySelector("details[open]") !== null;
  }

  function watch(id) {
    let timer = null;
    let fetching = false;

    function current() {
      const region = document.getElementById(id);
      return region && region.hasAttribute("data-refresh") && interval(region) ? region : null;
    }

    function later() {
      const region = current();
      if (region) {
        timer = window.setTimeout(refresh, interval(region) * 1000);
      }
    }

    function refresh() {
      timer = null;
      if (document.hidden || fetching || !current()) {
        return; // a hidden tab resumes when it is shown again
      }
      fetching = true;
      window
        .fetch(window.location.href, {
          credentials: "same-origin",
          cache: "no-store",
          // Marks the fetch as a refresh: the page leaves messages meant for the person's next page unread.
          headers: { Accept: "text/html", "X-Portal-Refresh": "1" },
        })
        .then(function (response) {
          // Signed out, gone or failing: stop, and let a reload show why.
          return response.ok && !response.redirected ? response.text() : null;
        })
        .then(function (html) {
          fetching = false;
          if (html === null) {
            return;
          }
          const fresh = new DOMParser().parseFromString(html, "text/html").getElementById(id);
          const region = document.getElementById(id);
          if (!fresh || !region) {
            return;
          }
          if (!inUse(region)) {
            const swapped = document.importNode(fresh, true);
            region.replaceWith(swapped);
            swapped.dispatchEvent(new CustomEvent("portal:refreshed", { bubbles: true }));
          }
          later();
        })
        .catch(function () {
          fetching = false; // the network blinked: try again at the next turn
          later();
        });
    }

    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && timer === null && !fetching) {
        refresh(); // what changed while the tab was hidden shows at once
      }
    });
    later();
  }

  document.querySelectorAll("[data-refresh][id]").forEach(function (region) {
    watch(region.id);
  });
})();
