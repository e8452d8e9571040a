// The cost estimate of the GPU request form, following the form as it is filled.
"use strict";

(function () {
  const form = document.getElementById("request-form");
  const out = document.getElementById("estimate");
  if (!form || !out) {
    return;
  }
  // Hourly prices come from the table of what can be requested (data-spec, data-price).
  const prices = {};
  document.querySelectorAll("tr[data-spec]").forEach(function (row) {
    prices[row.dataset.spec] = row.dataset.price;
  });

  // Sum of price × count over the chosen GPUs; unknown as soon as one has no price yet.
  function update() {
    let total = 0;
    let known = true;
    let any = false;
    for (let n = 0; form.elements["spec_" + n]; n++) {
      const spec = form.elements["spec_" + n].value;
      if (!spec) {
        continue;
      }
      any = true;
      const count = parseInt(form.elements["count_" + n].value || "1", 10);
      if (!prices[spec]) {
        known = false;
        continue;
      }
      total += parseFloat(prices[spec]) * count;
    }
    out.textContent = !any ? "—" : known ? total.toFixed(2) + " / h" : out.dataset.unknown;
  }

  form.addEventListener("input", update);
  update();
})();

// What can be requested follows the chosen workload type and cluster: the same availability the
// queue admits by, fetched from the specs API.
(function () {
  const form = document.getElementById("request-form");
  const offers = document.getElementById("offers");
  if (!form || !offers || !window.fetch) {
    return;
  }
  function refresh() {
    const query = new URLSearchParams({ limit: "500" });
    ["purpose", "cluster"].forEach(function (name) {
      if (form.elements[name] && form.elements[name].value) {
        query.set(name, form.elements[name].value);
      }
    });
    fetch(offers.dataset.source + "?" + query.toString(), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        return response.ok ? response.json() : null;
      })
      .then(function (page) {
        if (!page) {
          return;
        }
        const byId = {};
        page.results.forEach(function (offer) {
          byId[offer.id] = offer;
        });
        offers.querySelectorAll("tr[data-spec]").forEach(function (row) {
          const offer = byId[row.dataset.spec];
          row.classList.toggle("muted", !offer);
          row.querySelector('[data-field="available"]').textContent = offer ? offer.available : 0;
          row.querySelector('[data-field="total"]').textContent = offer ? offer.total : 0;
        });
      });
  }
  ["purpose", "cluster"].forEach(function (name) {
    if (form.elements[name]) {
      form.elements[name].addEventListener("change", refresh);
    }
  });
})();
