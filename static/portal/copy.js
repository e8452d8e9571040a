// Copy buttons: a button with data-copy="<id>" copies that element's text. The button stays hidden
// without JavaScript or a clipboard, where selecting the text by hand is the way. Buttons in a region that
// refreshed itself (portal.js) are wired when it arrives.
"use strict";

(function () {
  if (!navigator.clipboard) {
    return;
  }
  function wire(root) {
    root.querySelectorAll("button[data-copy]").forEach(function (button) {
      const target = document.getElementById(button.dataset.copy);
      if (!target) {
        return;
      }
      const label = button.textContent;
      button.hidden = false;
      button.addEventListener("click", function () {
        navigator.clipboard.writeText(target.textContent).then(function () {
          button.textContent = button.dataset.copied || label;
          window.setTimeout(function () {
            button.textContent = label;
          }, 2000);
        });
      });
    });
  }
  wire(document);
  document.addEventListener("portal:refreshed", function (event) {
    wire(event.target);
  });
})();
