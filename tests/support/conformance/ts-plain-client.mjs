// A client on the TypeScript SDK (@modelcontextprotocol/sdk 1.x) against mcp-celery, without the tasks
// extension, as hosts built on it call tools. Prints one JSON object with what it saw.
//
//   node ts-plain-client.mjs http URL
//   node ts-plain-client.mjs stdio PYTHON ROOT     (runs `PYTHON -m mcp_celery serve -A tests.support.sample_jobs`)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, root] = process.argv.slice(2);
const transport =
  mode === "http"
    ? new StreamableHTTPClientTransport(new URL(target))
    : new StdioClientTransport({
        command: target,
        args: ["-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"],
        cwd: root,
        env: process.env,
        stderr: "ignore",
      });
const client = new Client({ name: "ts-plain-client", version: "1.0.0" }, { capabilities: {} });
await client.connect(transport);
const seen = { mode, server: client.getServerVersion()?.name ?? null };
const text = (result) => result.content[result.content.length - 1].text;

seen.tools = (await client.listTools()).tools.map((tool) => tool.name).sort();

// A host's 1 s timeout, kept alive by the job's progress (25 steps of 0.1 s).
const progress = [];
const kept = await client.callTool({ name: "legacy_progress", arguments: { steps: 25 } }, undefined, {
  timeout: 1000,
  resetTimeoutOnProgress: true,
  onprogress: (p) => progress.push(p),
});
seen.progress = progress;
seen.keptAlive = text(kept);

// The same timeout without resetting it on progress: the host gives up (the job runs on regardless).
try {
  await client.callTool({ name: "legacy_progress", arguments: { steps: 25 } }, undefined, {
    timeout: 1000,
    onprogress: () => {},
  });
  seen.withoutReset = "answered";
} catch (error) {
  seen.withoutReset = error.code ?? String(error);
}

// Past the window: a task handle for a tool with an output schema (the SDK validates structuredContent).
const running = await client.callTool({ name: "slow_greeting", arguments: { name: "Ada", seconds: 4.5 } });
seen.isError = running.isError ?? false;
seen.handle = running._meta["mcp-celery/task"];
seen.handleStructured = running.structuredContent;
for (let round = 0; round < 30; round++) {
  const status = await client.callTool({
    name: "task_status",
    arguments: { task_id: seen.handle.taskId, wait_seconds: 3 },
  });
  if (["completed", "failed", "cancelled"].includes(status.structuredContent.status)) {
    seen.final = status.structuredContent.result.structuredContent;
    seen.finalText = text(status);
    break;
  }
}
await client.close();
console.log(JSON.stringify(seen));
