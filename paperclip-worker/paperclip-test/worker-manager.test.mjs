// The worker driven by Paperclip's own worker manager (`createPluginWorkerHandle`
// from @paperclipai/server), exactly as the server starts a plugin worker,
// against the CreateOS simulator.
//
// Needs: `cargo build -p paperclip-worker --bins --examples` (and root, for the
// simulator), `npm ci` here. Run: `npm test` here (Node 24 from node_modules).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  buildPackage,
  ledgerRows,
  pluginManifestValidator,
  rustWorkerPid,
  startHandle,
  startSimulator,
  waitUntil,
} from "./harness.mjs";

const SEED = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";
const WORKER_ERROR = -32002;
const METHOD_NOT_IMPLEMENTED = -32004;

let sim;
let pkg;
let handle;
let env;
/** Directories the tests made, removed at the end (a package holds the debug binaries: 200 MB). */
const scratch = [];

before(async () => {
  sim = await startSimulator();
  pkg = await buildPackage();
  scratch.push(pkg.dir);
  handle = await startHandle(pkg.dir, pkg.manifest);
  env = {
    driverKey: "createos",
    companyId: "acme",
    environmentId: "env-1",
    config: {
      apiKey: sim.apiKey,
      apiUrl: sim.url,
      shape: "s-1vcpu-1gb",
      reuseLease: true,
      requestsPerMinute: 100000,
    },
  };
});

after(async () => {
  await handle?.stop();
  await sim?.stop();
  for (const dir of scratch) rmSync(dir, { recursive: true, force: true });
});

/** Paperclip keeps a lease's metadata with keys of its own added. */
const paperclipMetadata = (lease) => ({ ...lease.metadata, pluginId: pkg.manifest.id, sandboxProviderPlugin: true });
const leaseIdParams = (lease) => ({
  ...env,
  providerLeaseId: lease.providerLeaseId,
  leaseMetadata: paperclipMetadata(lease),
});
const onLease = (lease) => ({ ...env, lease: { providerLeaseId: lease.providerLeaseId, metadata: paperclipMetadata(lease) } });
const acquire = (runId) => handle.call("environmentAcquireLease", { ...env, runId });

/** Rejects with a JSON-RPC error: returns it. */
async function rpcError(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("the call succeeded");
}

test("the package's manifest passes Paperclip's own validator", () => {
  const manifest = pluginManifestValidator().parseOrThrow(pkg.manifest);
  const [driver] = manifest.environmentDrivers;
  assert.equal(driver.kind, "sandbox_provider");
  assert.equal(driver.driverKey, "createos");
  assert.equal(driver.supportsReusableLeases, true);
  assert.equal(driver.configSchema.properties.apiKey.format, "secret-ref");
  assert.deepEqual(pkg.pkg.paperclipPlugin, { manifest: "./dist/manifest.js", worker: "./dist/worker.js" });
  assert.ok(handle.supportedMethods.includes("environmentExecute"));
  assert.ok(!handle.supportedMethods.includes("environmentCaptureTemplate"));
  // One hook, sync_files, serves both directions.
  assert.deepEqual(pkg.manifest.environmentDrivers[0].sandboxCapabilities, { reusableLeases: true, nativeSyncIn: true, nativeSyncOut: true });
  assert.ok(handle.supportedMethods.includes("environmentSyncIn") && handle.supportedMethods.includes("environmentSyncOut"));
});

test("a whole lease lifecycle, with live output reaching the manager's log route", async () => {
  const validated = await handle.call("environmentValidateConfig", { driverKey: "createos", config: env.config });
  assert.equal(validated.ok, true, JSON.stringify(validated));
  assert.equal(validated.normalizedConfig.apiKey, sim.apiKey, "the secret stays as Paperclip sent it");
  const probe = await handle.call("environmentProbe", env);
  assert.equal(probe.ok, true, JSON.stringify(probe));

  const lease = await acquire("run-lifecycle");
  assert.match(lease.providerLeaseId, /^[A-Za-z0-9_-]+$/);
  assert.ok(!JSON.stringify(lease).includes(sim.apiKey), "no key in the lease");
  const workspace = await handle.call("environmentRealizeWorkspace", { ...onLease(lease), workspace: {} });
  assert.equal(workspace.cwd, "/paperclip-workspace");

  // The command waits for a file that a second command makes once the first
  // one's output has reached the log route: it cannot end before its output did.
  const chunks = [];
  let started;
  const seen = new Promise((resolve) => { started = resolve; });
  const script = "echo started; while [ ! -e /paperclip-workspace/go ]; do sleep 0.05; done; echo finished; echo to-stderr >&2";
  const running = handle.call(
    "environmentExecute",
    { ...onLease(lease), command: "/bin/sh", args: ["-c", script] },
    60_000,
    (stream, chunk) => {
      chunks.push([stream, chunk]);
      if (chunk.includes("started")) started();
    },
  );
  await seen;
  const touch = await handle.call("environmentExecute", { ...onLease(lease), command: "/bin/touch", args: ["/paperclip-workspace/go"] });
  assert.equal(touch.exitCode, 0);
  const result = await running;
  assert.equal(result.exitCode, 0);
  assert.equal(result.timedOut, false);
  assert.equal(result.stdout, "started\nfinished\n");
  const streamed = (name) => chunks.filter(([stream]) => stream === name).map(([, chunk]) => chunk).join("");
  assert.equal(streamed("stdout"), result.stdout);
  assert.equal(streamed("stderr"), "to-stderr\n");

  const released = await handle.call("environmentReleaseLease", leaseIdParams(lease));
  assert.deepEqual(released, { providerLeaseId: lease.providerLeaseId, state: "stopped" });
  const resumed = await handle.call("environmentResumeLease", leaseIdParams(lease));
  assert.equal(resumed.providerLeaseId, lease.providerLeaseId);
  const again = await handle.call("environmentExecute", { ...onLease(resumed), command: "/bin/cat", args: ["/paperclip-workspace/go"] });
  assert.equal(again.exitCode, 0, "the resumed lease is the same sandbox");
  const destroyed = await handle.call("environmentDestroyLease", leaseIdParams(resumed));
  assert.deepEqual(destroyed, { providerLeaseId: lease.providerLeaseId, state: "destroyed" });
  assert.ok(!(await sim.live()).includes(lease.providerLeaseId));
});

test("the seed: unconfirmed cleanup fails the release with the provider's sentence, and destroy clears it", async () => {
  const lease = await acquire("run-seed");
  // The command outlives its deadline, and its process tree's termination fails.
  const fault = await sim.addFault({ route: "DELETE /v1/sandboxes/*/processes/*", trigger: { from: 1 }, kind: { status: 500 } });
  const failed = await rpcError(
    handle.call("environmentExecute", { ...onLease(lease), command: "/bin/sleep", args: ["60"], timeoutMs: 500 }),
  );
  assert.equal(failed.code, WORKER_ERROR);
  assert.equal(failed.data.kind, "cleanup_unconfirmed");
  await sim.clearFaults();
  assert.ok(fault.id !== undefined);

  const refused = await rpcError(handle.call("environmentReleaseLease", leaseIdParams(lease)));
  assert.equal(refused.message, SEED, "word for word");
  assert.equal(refused.code, WORKER_ERROR);
  assert.equal(refused.data.kind, "cleanup_unconfirmed");
  assert.equal(refused.data.leaseDestroyed, true, "never reused: destroyed instead");
  assert.ok(!(await sim.live()).includes(lease.providerLeaseId));

  const destroyed = await handle.call("environmentDestroyLease", leaseIdParams(lease));
  assert.equal(destroyed.state, "destroyed");
  const resumed = await handle.call("environmentResumeLease", leaseIdParams(lease));
  assert.equal(resumed.providerLeaseId, null, "a destroyed lease comes back expired");
});

test("files sync in and out", async () => {
  const lease = await acquire("run-sync");
  const local = mkdtempSync(path.join(tmpdir(), "paperclip-sync-"));
  scratch.push(local);
  mkdirSync(path.join(local, "src"));
  writeFileSync(path.join(local, "src", "input.txt"), "hello from the host\n");
  const synced = await handle.call("environmentSyncIn", {
    ...onLease(lease),
    operations: [{
      operationId: "in",
      files: [{ sourcePath: path.join(local, "src"), targetPath: "/paperclip-workspace/src", kind: "directory" }],
      postUploadCommands: [{ command: "tr a-z A-Z < src/input.txt > result.txt", cwd: "/paperclip-workspace" }],
    }],
  });
  assert.equal(synced.operations[0].operationId, "in");
  assert.equal(synced.operations[0].filesTransferred, 1);
  const back = await handle.call("environmentSyncOut", {
    ...onLease(lease),
    operations: [{
      operationId: "out",
      files: [{ sourcePath: "/paperclip-workspace/result.txt", targetPath: path.join(local, "result.txt"), kind: "file" }],
    }],
  });
  assert.equal(back.operations[0].filesTransferred, 1);
  assert.equal(readFileSync(path.join(local, "result.txt"), "utf8"), "HELLO FROM THE HOST\n");
  await handle.call("environmentDestroyLease", leaseIdParams(lease));
});

test("bad input gets a JSON-RPC error and the worker lives on", async () => {
  const unimplemented = await rpcError(handle.call("environmentCaptureTemplate", { ...env, providerLeaseId: null }));
  assert.equal(unimplemented.code, METHOD_NOT_IMPLEMENTED);
  const unknown = await rpcError(handle.call("noSuchMethod", {}));
  assert.equal(unknown.code, -32601);
  const malformed = await rpcError(handle.call("environmentAcquireLease", { driverKey: "createos", companyId: "acme" }));
  assert.equal(malformed.code, -32602);
  assert.match(malformed.message, /environmentAcquireLease/);
  const otherDriver = await rpcError(handle.call("environmentAcquireLease", { ...env, driverKey: "e2b", runId: "r" }));
  assert.equal(otherDriver.code, -32602);
  assert.match(otherDriver.message, /serves driver `createos`, not `e2b`/);

  const invalid = await handle.call("environmentValidateConfig", { driverKey: "createos", config: { shape: "s-huge" } });
  assert.equal(invalid.ok, false);
  assert.ok(invalid.errors.length > 0);
  const refused = await rpcError(handle.call("environmentAcquireLease", { ...env, config: { ...env.config, shape: "s-huge" }, runId: "r" }));
  assert.equal(refused.code, WORKER_ERROR);
  assert.equal(refused.data.kind, "invalid_config");
  assert.ok(!refused.message.includes(sim.apiKey));

  const health = await handle.call("health", {});
  assert.equal(health.status, "ok");
  assert.equal(handle.status, "running");
});

test("a worker killed mid-acquire is restarted by the manager, whose next start sweeps what only it could name", async () => {
  const crashy = await startHandle(pkg.dir, pkg.manifest, { autoRestart: true });
  try {
    const call = (method, params) => crashy.call(method, params);
    const handed = await call("environmentAcquireLease", { ...env, runId: "run-kept" });

    // The next acquire creates its sandbox, records it, and stalls preparing it.
    await sim.addFault({ route: "POST /v1/sandboxes/*/exec", trigger: { from: 1 }, kind: { delay_ms: 60_000 } });
    const stalled = call("environmentAcquireLease", { ...env, runId: "run-killed" });
    stalled.catch(() => {});
    const recorded = () => ledgerRows(pkg.dir).find((row) => row.runId === "run-killed" && row.providerLeaseId);
    await waitUntil("the stalled acquire's sandbox is in the ledger", recorded);
    const orphan = recorded();
    // Its creation request left and its reply named the sandbox: `creating`
    // until the acquire returns to Paperclip.
    assert.equal(orphan.state, "creating", "recorded before the acquire returned");
    assert.ok((await sim.live()).includes(orphan.providerLeaseId));

    const restarted = new Promise((resolve) => crashy.on("ready", resolve));
    process.kill(rustWorkerPid(crashy.diagnostics().pid), "SIGKILL");
    await assert.rejects(stalled);
    await restarted;
    await sim.clearFaults();

    // The first lease call of the new worker sweeps: the orphan goes, the
    // lease Paperclip was handed stays, and the new worker serves it.
    const health = await call("health", {});
    assert.equal(health.status, "ok");
    const fresh = await call("environmentAcquireLease", { ...env, runId: "run-after" });
    const live = await sim.live();
    assert.ok(!live.includes(orphan.providerLeaseId), "the sandbox only the dead worker could name was swept");
    assert.ok(live.includes(handed.providerLeaseId), "the lease Paperclip holds was kept");
    const run = await call("environmentExecute", { ...onLease(handed), command: "/bin/true" });
    assert.equal(run.exitCode, 0);
    await call("environmentDestroyLease", leaseIdParams(handed));
    await call("environmentDestroyLease", leaseIdParams(fresh));
  } finally {
    await sim.clearFaults();
    await crashy.stop();
  }
});

test("an upgrade in place: the restarted worker resumes and destroys the old one's leases, and unconfirmed ones stay refused", async () => {
  const upgraded = await startHandle(pkg.dir, pkg.manifest);
  try {
    const kept = await upgraded.call("environmentAcquireLease", { ...env, runId: "run-before-upgrade" });
    await upgraded.call("environmentReleaseLease", leaseIdParams(kept));
    const poisoned = await upgraded.call("environmentAcquireLease", { ...env, runId: "run-poisoned" });
    await sim.addFault({ route: "DELETE /v1/sandboxes/*/processes/*", trigger: { from: 1 }, kind: { status: 500 } });
    await rpcError(upgraded.call("environmentExecute", { ...onLease(poisoned), command: "/bin/sleep", args: ["60"], timeoutMs: 500 }));
    await sim.clearFaults();

    // The operator installs a new build over the package, and the server restarts its worker.
    await buildPackage(pkg.dir);
    await upgraded.restart();

    const resumed = await upgraded.call("environmentResumeLease", leaseIdParams(kept));
    assert.equal(resumed.providerLeaseId, kept.providerLeaseId);
    const refused = await rpcError(upgraded.call("environmentExecute", { ...onLease(poisoned), command: "/bin/true" }));
    assert.equal(refused.message, SEED);
    const release = await rpcError(upgraded.call("environmentReleaseLease", leaseIdParams(poisoned)));
    assert.equal(release.message, SEED);
    await upgraded.call("environmentDestroyLease", leaseIdParams(poisoned));
    await upgraded.call("environmentDestroyLease", leaseIdParams(resumed));
    const live = await sim.live();
    assert.ok(!live.includes(kept.providerLeaseId) && !live.includes(poisoned.providerLeaseId));
  } finally {
    await sim.clearFaults();
    await upgraded.stop();
  }
});

test("shutdown: the worker answers, stops its work and exits", async () => {
  const stopping = await startHandle(pkg.dir, pkg.manifest);
  const lease = await stopping.call("environmentAcquireLease", { ...env, runId: "run-shutdown" });
  const processes = await sim.count("POST /v1/sandboxes/*/processes");
  const running = stopping.call("environmentExecute", { ...onLease(lease), command: "/bin/sleep", args: ["60"] });
  running.catch(() => {});
  await waitUntil("the command runs", async () => (await sim.count("POST /v1/sandboxes/*/processes")) > processes);
  await stopping.stop();
  assert.equal(stopping.status, "stopped");
  await assert.rejects(running);
  await handle.call("environmentDestroyLease", leaseIdParams(lease));
});

test("the ledger never holds the API key", () => {
  const rows = ledgerRows(pkg.dir);
  assert.ok(rows.length > 0);
  assert.ok(!JSON.stringify(rows).includes(sim.apiKey));
});
