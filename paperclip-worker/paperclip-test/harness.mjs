// What the Node test and the benchmark share: the built programs, the
// simulator under control, the plugin package, and Paperclip's own worker
// manager driving the worker.
import { spawn, execFileSync } from "node:child_process";
import { createInterface } from "node:readline";
import { existsSync, mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const target = process.env.CARGO_TARGET_DIR ?? path.join(root, "target");
const profile = path.join(target, process.env.PROFILE ?? "debug");

export const programs = {
  worker: path.join(profile, "paperclip-worker"),
  // Beside the binaries when built as a package of its own, else in deps/.
  provider: [profile, path.join(profile, "deps")].map((dir) => path.join(dir, "libcreateos_provider.so")).find(existsSync),
  sim: path.join(profile, "examples", "sim-control"),
  harness: path.join(profile, "host-harness"),
};

// Paperclip's server modules, by file URL: they are not in the package's exports.
const server = path.join(here, "node_modules", "@paperclipai", "server", "dist", "services");
const { createPluginWorkerHandle } = await import(pathToFileURL(path.join(server, "plugin-worker-manager.js")).href);
const { pluginManifestValidator } = await import(pathToFileURL(path.join(server, "plugin-manifest-validator.js")).href);
export { createPluginWorkerHandle, pluginManifestValidator };

/** The simulator (`sim-control`), answering one command at a time. */
export async function startSimulator() {
  const child = spawn(programs.sim, [], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = JSON.parse((await lines.next()).value);
  let queue = Promise.resolve();
  const ask = (command) => {
    const answer = queue.then(async () => {
      child.stdin.write(JSON.stringify(command) + "\n");
      return JSON.parse((await lines.next()).value);
    });
    queue = answer.catch(() => {});
    return answer;
  };
  return {
    url: first.url,
    apiKey: first.apiKey,
    addFault: (rule) => ask({ addFault: rule }),
    clearFaults: () => ask({ clearFaults: true }),
    live: async () => (await ask({ liveSandboxes: true })).live,
    count: async (route) => (await ask({ count: route })).count,
    stop: () => new Promise((resolve) => { child.on("exit", resolve); child.stdin.end(); }),
  };
}

/** Builds the plugin package into `dir` (default: a new directory); returns it and its manifest. */
export async function buildPackage(dir = mkdtempSync(path.join(tmpdir(), "paperclip-plugin-"))) {
  execFileSync(programs.worker, ["package", "--plugin", programs.provider, "--out", dir]);
  const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
  const manifestModule = await import(pathToFileURL(path.join(dir, pkg.paperclipPlugin.manifest)).href);
  return { dir, pkg, manifest: manifestModule.default };
}

/** Paperclip's worker manager for the package in `dir`, started. */
export async function startHandle(dir, manifest, options = {}) {
  const handle = createPluginWorkerHandle(manifest.id, {
    entrypointPath: path.join(dir, "dist", "worker.js"),
    manifest,
    config: {},
    instanceInfo: { instanceId: "paperclip-worker-test", hostVersion: "2026.916.1" },
    apiVersion: 1,
    hostHandlers: {},
    autoRestart: options.autoRestart ?? false,
    env: {},
  });
  await handle.start();
  return handle;
}

/** The rows of the package's lease ledger (`host-harness leases --json`). */
export function ledgerRows(dir) {
  const ledger = path.join(dir, "state", "ledger.sqlite3");
  const text = execFileSync(programs.harness, ["leases", "--ledger", ledger, "--json"], { encoding: "utf8" });
  return text.split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));
}

/** The pid of the Rust worker the package's entry point (`pid`) started. */
export function rustWorkerPid(pid) {
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    const children = readFileSync(`/proc/${pid}/task/${task}/children`, "utf8").trim();
    if (children) return Number(children.split(/\s+/)[0]);
  }
  throw new Error(`process ${pid} has no child`);
}

/** Waits until `condition()` holds, checking every 20 ms; fails after `limitMs` (a guard against a hang). */
export async function waitUntil(what, condition, limitMs = 30_000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
