"""The sandboxed interpreter's first code (run as ``python -I -c``, stdlib only): limits,
then an audit hook, then the tool call's code.

argv: scratch folder, code file, CPU seconds, memory bytes, file-size bytes. The hook refuses
(PermissionError) what a tool call may not do: open, list, create or remove files outside
the scratch folder (reading the interpreter's own library is allowed, so imports work),
open sockets, start processes, send signals, or load native code through ctypes.
"""

import os
import resource
import sys
import sysconfig

scratch, code_file = os.path.realpath(sys.argv[1]), sys.argv[2]
cpu, memory, file_size = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

resource.setrlimit(resource.RLIMIT_CPU, (max(1, int(cpu)), max(1, int(cpu)) + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

with open(code_file, encoding="utf-8") as handle:
    source = handle.read()

_READABLE = tuple({os.path.realpath(p) + os.sep for p in (
    sys.prefix, sys.base_prefix, sys.exec_prefix,
    *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
) if p})
_WRITABLE = scratch + os.sep
_PROCESS = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
            "subprocess.Popen", "os.kill", "os.killpg", "pty.spawn", "os.setuid", "os.chroot"}
_LISTS = {"os.listdir", "os.scandir", "glob.glob"}
_CHANGES = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
            "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "os.chdir"}
_DEVICES = ("/dev/null", "/dev/urandom")
_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "mmap", "resource"}


def _inside(path: object, roots: tuple[str, ...]) -> bool:
    if isinstance(path, int):  # an open file descriptor: already allowed once
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return any(real + os.sep == root or real.startswith(root) for root in roots)


def _hook(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
        roots = (_WRITABLE,) if writes else (_WRITABLE, *_READABLE)
        if not (_inside(path, roots) or (not writes and path in _DEVICES)):
            raise PermissionError(f"sandbox: no access to {path!r} outside the scratch folder")
    elif event in _LISTS:
        if args and not _inside(args[0] if args[0] is not None else ".",
                                (_WRITABLE, *_READABLE)):
            raise PermissionError(f"sandbox: {event} outside the scratch folder is not allowed")
    elif event in _CHANGES:
        if not all(_inside(p, (_WRITABLE,)) for p in args[:2] if isinstance(p, str | bytes)):
            raise PermissionError(f"sandbox: {event} outside the scratch folder is not allowed")
    elif event in ("os.rename", "os.replace"):
        if not all(_inside(p, (_WRITABLE,)) for p in args[:2]):
            raise PermissionError("sandbox: renames outside the scratch folder are not allowed")
    elif event.startswith("socket.") or event in _PROCESS or event.startswith("ctypes."):
        raise PermissionError(f"sandbox: {event} is not allowed (no network, processes, "
                              "signals or native code)")
    elif event == "import" and str(args[0]).split(".")[0] in _MODULES:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")


os.chdir(scratch)
sys.addaudithook(_hook)
del resource
sys.modules.pop("resource", None)
exec(compile(source, "<tool>", "exec"), {"__name__": "__main__"})
