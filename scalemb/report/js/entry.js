// The one export the map page needs, as a global: window.createScatterplot (regl-scatterplot's default export).
import createScatterplot from "regl-scatterplot/src/index.js";  // the sources: each dependency bundled (and licensed) separately

window.createScatterplot = createScatterplot;
