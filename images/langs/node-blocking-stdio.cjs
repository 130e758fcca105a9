// Preloaded into every JavaScript run (sandboxd.verifiers.code.NODE_BLOCKING_STDIO):
// Node writes to a full pipe asynchronously, so a program ending in process.exit()
// lost all but the first 64 KiB of its output. Blocking stdout and stderr, as Node
// makes them for files, keeps it all.
[process.stdout, process.stderr].forEach((s) => s._handle && s._handle.setBlocking && s._handle.setBlocking(true));
