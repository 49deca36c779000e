// Probot reference server of bench/suite.py (ingest): the common webhook-bot framework,
// fed the same signed Gitea deliveries as forgeflow (Gitea also sends X-GitHub-Event,
// X-GitHub-Delivery and X-Hub-Signature-256). It verifies the signature, parses the
// payload and runs an `issue_comment.created` handler that stores nothing, so it marks
// what a non-durable server reaches on this machine.
//
// Usage: node app.js PORT SECRET        (answers 200 "ok" per verified delivery)
import { generateKeyPairSync } from "node:crypto";
import { createServer } from "node:http";
import { Probot, createNodeMiddleware } from "probot";

const [port, secret] = process.argv.slice(2);
if (!port || !secret) {
  console.error("usage: node app.js PORT SECRET");
  process.exit(2);
}

// Probot insists on GitHub App credentials; the handler never calls an API, so a
// throwaway key is enough.
const { privateKey } = generateKeyPairSync("rsa", {
  modulusLength: 2048,
  privateKeyEncoding: { type: "pkcs1", format: "pem" },
  publicKeyEncoding: { type: "spki", format: "pem" },
});

let mentions = 0;
const app = (probot) => {
  probot.on("issue_comment.created", async (context) => {
    // Look at the comment as a bot would (is it a mention?), then keep nothing.
    if (context.payload.comment.body.includes("@ccweb-bot")) mentions += 1;
  });
};

const probot = new Probot({ appId: 1, privateKey, secret, logLevel: "warn" });
const middleware = await createNodeMiddleware(app, {
  probot,
  webhooksPath: "/api/gitea/webhook",
});

const server = createServer((req, res) => {
  if (req.url === "/healthz") {
    res.writeHead(200, { "content-type": "text/plain" }).end(`ok ${mentions}\n`);
    return;
  }
  middleware(req, res, () => res.writeHead(404).end());
});
server.keepAliveTimeout = 75_000; // the load generator keeps its connections open
server.listen(Number(port), "127.0.0.1");
process.on("SIGTERM", () => server.close(() => process.exit(0)));
