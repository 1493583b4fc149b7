// The /docs page: Swagger UI (swagger-ui-bundle.js, from the swagger-ui-py package) on this
// gateway's /openapi.json. A file, not an inline script: the page's CSP allows scripts from this
// origin only. The token given to "Authorize" stays in this page's memory (no storage).
window.addEventListener("load", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    docExpansion: "list",
    defaultModelsExpandDepth: 0,
    defaultModelExpandDepth: 2,
    showExtensions: true,
    persistAuthorization: false,
    validatorUrl: null, // no badge fetched from another site
  });
});
