// The idemgate console's one script, a progressive enhancement: every page works without it.
// On the resolve page it shows the result field only while "completed" is chosen.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var field = document.querySelector(".result-field");
  var radios = document.querySelectorAll('input[name="resolution"]');
  if (!field || radios.length === 0) {
    return;
  }
  function update() {
    var chosen = document.querySelector('input[name="resolution"]:checked');
    field.classList.toggle("hidden", !chosen || chosen.value !== "completed");
  }
  radios.forEach(function (r) {
    r.addEventListener("change", update);
  });
  update();
});
