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
