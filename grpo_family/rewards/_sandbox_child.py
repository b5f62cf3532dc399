"""The code sandbox's first process (see :mod:`grpo_family.rewards.code` and ``docs/code_sandbox.md``).

:class:`~grpo_family.rewards.code.Sandbox` starts ``python -I -S -B -X utf8 -c <bootstrap> <this directory>``,
which loads this file and ``_plain_values.py`` by path and calls :func:`main`, in the run's directory, where it
left ``sandbox.json`` (settings, and the helpers the prompt provides) and ``program.py``. It applies the layers the
code module's docstring lists (namespaces, the private filesystem view: :func:`private_root`), then forks:

* the **program** process, which drops to its own uid, loads its limits, syscall filter and audit hook, writes a
  JSON report of the layers it got as the first line of the status pipe (and closes that pipe), and runs the
  program. For an assert test it then serves the judge's calls into the program over a pipe pair, as plain data
  (:class:`~grpo_family.rewards._plain_values.Wire`);
* for an assert test, the **judge** process, which drops to a second uid, loads the same layers, reads the test
  from a pipe the program never holds, and runs it as ordinary Python in a namespace the program cannot touch
  (:class:`TestNamespace`): the prompt's helpers, standard modules imported here, and stand-ins for the program's
  names whose calls go to the program. Its verdict goes to the parent on a pipe of its own.

The packages a reward lists (``Sandbox(packages=...)``) arrive as ``cfg["packages"]``, the paths the parent chose;
they are bound read-only into one directory (:func:`bind_packages`; symlinked where nothing can be mounted:
:func:`link_packages`) that only the program's ``sys.path`` gets: the judge keeps the standard library.

Pass or fail is decided by the judge, never by the program's interpreter. Standard library only, and nothing of
the package is imported: ``-I -S`` keep site-packages (and the package) out of reach, and the rewards directory
must never be on ``sys.path`` (its ``code.py`` and ``math.py`` would shadow the standard library for the program),
so the bootstrap loads :class:`Wire`'s module by path before this one. Imported as a module (tests, tools) it runs
nothing.
"""

import json
import os
import signal
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
READONLY = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV  # a bind made read-only, nosuid, nodev
CLONE = {"net": 0x40000000, "mnt": 0x00020000, "pid": 0x20000000, "ipc": 0x08000000, "uts": 0x04000000}
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 4, 38, 22, 2
# Only where the number is known to be right.
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
# Where the listed packages' paths (``Sandbox(packages=...)``, decided by the parent) appear: in the private view a
# directory of the read-only skeleton; in the shared view one in the private /tmp; without mounts the run's
# directory holds symlinks. Only the program's sys.path gets it.
PACKAGES_DIR, SHARED_PACKAGES_DIR, LINKED_PACKAGES_DIR = "/packages", "/tmp/.packages", ".packages"
# In the run's own IPC namespace: no System V queue, semaphore set or shared memory segment, no POSIX queue (the
# syscall filter refuses them too; these hold where it is off).
IPC_LIMITS = (("kernel/msgmni", "0"), ("kernel/sem", "0 0 0 0"), ("kernel/shmmni", "0"), ("fs/mqueue/queues_max", "0"))
# What a test may do with a program object besides calling it and reading its attributes: each is answered by the
# program, as plain Python would (never ==, <, in or hash: those are decided on the values, here).
SPECIAL = {"bool": bool, "len": len, "iter": iter, "next": next, "getitem": lambda obj, key: obj[key]}
MAX_NOTE = 300


def exit_code(status):
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def load_libc(report):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.unshare.argtypes = [ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        return {"ctypes": ctypes, "libc": libc}
    except Exception as e:
        report["notes"].append(f"ctypes unavailable: {e}")
        return {}


def fail_with_errno(ctypes, what):
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(os_tools, source, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else os.fsencode(s)

    if os_tools["libc"].mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        fail_with_errno(os_tools["ctypes"], f"mount {target}")


def syscall(os_tools, numbers, *args):
    number = numbers.get(os.uname().machine)
    if number is None:
        raise OSError(f"syscall number unknown on {os.uname().machine}")
    ctypes = os_tools["ctypes"]
    return os_tools["libc"].syscall(ctypes.c_long(number), *args)


# ------------------------------------------------------------------------------------------------ the filesystem


def stdlib_dirs():
    dirs = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)})
    return [d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs if o != d)]


def hide_installed_packages(os_tools, root):
    """Cover the third-party package directories inside the standard library's (a base installation keeps its
    ``site-packages`` there, e.g. ``lib/python3.11/site-packages``) with an empty read-only tmpfs: only the standard
    library is readable inside."""
    for stdlib in stdlib_dirs():
        for name in ("site-packages", "dist-packages"):
            inside = root + stdlib + "/" + name
            if os.path.isdir(inside):
                mount(os_tools, "tmpfs", inside, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      "size=4k,nr_inodes=2,mode=555")  # fmt: skip


def elf_interpreter(path):
    """The dynamic loader a 64-bit little-endian ELF file names (PT_INTERP), or None."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if header[:6] != b"\x7fELF\x02\x01":
                return None
            phoff = int.from_bytes(header[32:40], "little")
            phentsize, phnum = int.from_bytes(header[54:56], "little"), int.from_bytes(header[56:58], "little")
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                if int.from_bytes(entry[0:4], "little") == 3:  # PT_INTERP
                    offset, size = int.from_bytes(entry[8:16], "little"), int.from_bytes(entry[32:40], "little")
                    f.seek(offset)
                    return os.fsdecode(f.read(size).rstrip(b"\0"))
    except OSError:
        return None
    return None


def interpreter_files():
    """What the private view shows (read-only): ``(bound, linked)``. ``bound`` are the real paths bound into it:
    the interpreter, its dynamic loader, the directories of the shared libraries it has loaded (where the
    libraries of the standard library's extension modules live too), the standard library and the loader's cache;
    ``linked`` are paths whose symlinks are copied as symlinks (the interpreter as it was started, the loader's
    path, the root's own symlinks such as ``/lib -> usr/lib``)."""
    executable = os.path.realpath(sys.executable)
    loader = elf_interpreter(executable)
    bound = {executable, *stdlib_dirs()}
    if loader:
        bound.add(os.path.realpath(loader))
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and ".so" in os.path.basename(path):
                bound.add(os.path.dirname(path))  # the kernel gives the resolved path
    if os.path.isfile("/etc/ld.so.cache"):
        bound.add("/etc/ld.so.cache")
    pruned = []
    for path in sorted(bound):
        if os.path.exists(path) and not any(path == p or path.startswith(p + "/") for p in pruned):
            pruned.append(path)
    linked = [sys.executable] + ([loader] if loader else [])
    linked += [os.path.join("/", name) for name in os.listdir("/") if os.path.islink(os.path.join("/", name))]
    return pruned, linked


def copy_links(root, path):
    """Recreate under ``root`` the symlinks met on the way to ``path`` (best effort: only exec needs them)."""
    parts = [p for p in path.split("/") if p]
    current, hops = "/", 0
    while parts and hops < 40:
        part = parts.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            hops += 1
            target = os.readlink(candidate)
            inside = root + candidate
            try:
                if not os.path.lexists(inside):
                    os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
                    os.symlink(target, inside)
            except OSError:
                return
            parts = [p for p in target.split("/") if p] + parts
            current = "/" if target.startswith("/") else current
        else:
            current = candidate


def bind_readonly(os_tools, path, inside):
    """Bind ``path`` at ``inside`` (created: a directory, or an empty file for a file) read-only, nosuid and
    nodev. Not noexec: the interpreter and native extensions are mapped executable from these binds."""
    if os.path.isdir(path):
        os.makedirs(inside, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
        open(inside, "a").close()
    mount(os_tools, path, inside, None, MS_BIND)
    mount(os_tools, None, inside, None, READONLY)


def bind_packages(os_tools, paths, target, sources=None):
    """Bind each listed package path (``/site-packages/numpy``) read-only into ``target`` under its own name
    (``<target>/numpy``): one directory holding exactly those paths, so one ``sys.path`` entry finds them, and a
    native library found relative to its extension (``numpy.libs`` beside ``numpy``) is where it expects.
    ``sources``: where to bind each from, if not its path (``/proc/self/fd/N`` of a descriptor opened before a
    mount covered the path)."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    for path, source in zip(paths, sources or paths):
        bind_readonly(os_tools, source, os.path.join(target, os.path.basename(path)))


def link_packages(paths, target):
    """Without a mount namespace: ``target``, a directory of symlinks to the listed package paths. The host's tree
    is the program's view then anyway; this only decides what its ``sys.path`` finds."""
    os.mkdir(target, mode=0o755)
    for path in paths:
        os.symlink(path, os.path.join(target, os.path.basename(path)))


def private_root(os_tools, cfg, workdir, report, in_pid_ns, exposed):
    """Build a new root holding only ``exposed`` (read-only), a private ``/tmp`` with the run's directory, ``/dev``
    with a few devices and a devpts instance of its own, and ``/proc`` of the PID namespace; then ``pivot_root``
    into it and drop the host's tree. Host sockets, FIFOs, checkouts and datasets are not in it."""
    bound, linked = exposed
    root = workdir  # its files were read already; a tmpfs over it is the new root's skeleton
    mount(os_tools, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    for path in bound:
        bind_readonly(os_tools, path, root + path)
    hide_installed_packages(os_tools, root)
    if cfg["packages"]:
        bind_packages(os_tools, cfg["packages"], root + PACKAGES_DIR)
        report["packages"] = PACKAGES_DIR
    for path in linked:
        copy_links(root, path)
    size = f"size={cfg['disk_mb']}m,nr_inodes={cfg['tmpfs_inodes']}"
    os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)
    mount(os_tools, "tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    if workdir.startswith("/tmp/"):
        os.makedirs(root + workdir, mode=0o700)
    else:  # a tmpfs of its own
        os.makedirs(root + workdir, mode=0o700, exist_ok=True)
        mount(os_tools, "tmpfs", root + workdir, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=700")
    dev = root + "/dev"
    os.makedirs(dev, mode=0o755, exist_ok=True)
    mount(os_tools, "tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "a").close()
            mount(os_tools, "/dev/" + name, f"{dev}/{name}", None, MS_BIND)
    os.makedirs(dev + "/pts")
    pty_options = f"newinstance,ptmxmode=0666,mode=0620,max={cfg['max_ptys']}"
    mount(os_tools, "devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, pty_options)
    os.symlink("pts/ptmx", dev + "/ptmx")
    os.makedirs(dev + "/shm")
    mount(os_tools, "tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64,mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{dev}/{name}")
    if in_pid_ns:
        os.makedirs(root + "/proc", mode=0o555)
        mount(os_tools, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/.old")
    ctypes = os_tools["ctypes"]
    new_root, put_old = ctypes.c_char_p(os.fsencode(root)), ctypes.c_char_p(os.fsencode(root + "/.old"))
    if syscall(os_tools, SYS_PIVOT_ROOT, new_root, put_old) != 0:
        fail_with_errno(ctypes, "pivot_root")
    os.chdir("/")
    if os_tools["libc"].umount2(b"/.old", MNT_DETACH) != 0:
        fail_with_errno(ctypes, "umount the host's tree")
    os.rmdir("/.old")
    mount(os_tools, None, "/", None, READONLY)  # the skeleton itself: nothing can be created in it
    report["private_root"] = True
    report["exposed"] = bound
    report["private_tmp"] = True
    report["tmpfs_inodes"] = cfg["tmpfs_inodes"]
    report["pty_limit"] = cfg["max_ptys"]


def readonly_root(os_tools):
    # mount_setattr("/", AT_RECURSIVE, {MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID}): every mount below / read-only.
    ctypes = os_tools["ctypes"]

    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    attr = MountAttr(0x1 | 0x2, 0, 0, 0)
    args = (ctypes.c_int(-100), ctypes.c_char_p(b"/"), ctypes.c_uint(0x8000), ctypes.byref(attr))
    if syscall(os_tools, SYS_MOUNT_SETATTR, *args, ctypes.c_size_t(ctypes.sizeof(attr))) != 0:
        fail_with_errno(ctypes, "mount_setattr")


def shared_view(os_tools, cfg, workdir, report, in_pid_ns):
    """The fallback when the private root cannot be built: the host's tree read-only, a private ``/tmp`` (the
    host's files stay readable; ``missing_layers`` says so)."""
    try:
        readonly_root(os_tools)
        report["readonly_root"] = True
    except OSError as e:
        report["notes"].append(str(e))
    size = f"size={cfg['disk_mb']}m,nr_inodes={cfg['tmpfs_inodes']}"
    # Held open across the private /tmp's mount, which covers a package installed under /tmp (a virtual environment
    # there, as CI's): bound from /proc/self/fd/N, the directory the path named before.
    held = [os.open(path, os.O_PATH | os.O_CLOEXEC) for path in cfg["packages"]]
    mount(os_tools, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    if os.path.isdir(workdir):  # not under /tmp: a tmpfs of its own
        mount(os_tools, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=700")
    else:
        os.makedirs(workdir, mode=0o700)
    report["private_tmp"] = True
    report["tmpfs_inodes"] = cfg["tmpfs_inodes"]
    if cfg["packages"]:
        try:  # before the hiding, which may cover where they are; a failure leaves them to link_packages
            bind_packages(os_tools, cfg["packages"], SHARED_PACKAGES_DIR, [f"/proc/self/fd/{fd}" for fd in held])
            report["packages"] = SHARED_PACKAGES_DIR
        except OSError as e:
            report["notes"].append(f"packages not bound: {e}")
    for fd in held:
        os.close(fd)
    hide_installed_packages(os_tools, "")
    if in_pid_ns:
        mount(os_tools, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


# ------------------------------------------------------------------------------------------------ confinement


def readable_as(uid, paths):
    os.setegid(uid)
    os.seteuid(uid)
    try:
        return all(os.access(p, os.R_OK | os.X_OK, effective_ids=True) for p in paths) and os.access(
            os.__file__, os.R_OK, effective_ids=True
        )
    finally:
        os.seteuid(0)
        os.setegid(0)


def user_task_count(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


def install_syscall_filter(os_tools, program):
    # The BPF program was compiled by libseccomp in the parent; load it with prctl (no_new_privs is set).
    ctypes = os_tools["ctypes"]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if os_tools["libc"].prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        fail_with_errno(ctypes, "seccomp")


def install_guard(workdir, allow_subprocesses):
    root = os.path.realpath(workdir)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    blocked = {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.call_function",
        "ctypes.cdata",
    }
    if not allow_subprocesses:
        blocked |= {
            "os.fork",
            "os.forkpty",
            "os.system",
            "os.exec",
            "os.posix_spawn",
            "os.spawn",
            "subprocess.Popen",
            "os.startfile",
        }
    blocked = frozenset(blocked)
    own_pid = os.getpid()
    blocked_modules = frozenset({"ctypes", "_ctypes"})
    path_events = {
        "os.remove": (0,),
        "os.rmdir": (0,),
        "os.mkdir": (0,),
        "os.rename": (0, 1),
        "os.symlink": (1,),
        "os.link": (1,),
        "os.chmod": (0,),
        "os.chown": (0,),
        "os.truncate": (0,),
        "os.utime": (0,),
        "os.mkfifo": (0,),
        "os.mknod": (0,),
    }
    realpath, fspath, fsdecode = os.path.realpath, os.fspath, os.fsdecode

    def inside(path):
        if isinstance(path, int):
            return True  # an open file descriptor
        p = realpath(fsdecode(fspath(path)))
        return p == root or p.startswith(root + "/") or p == "/dev/null"

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(flags, int) and flags & write_flags) or (
                isinstance(mode, str) and any(c in mode for c in "wax+")
            )
            if writing and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing outside the run's directory is blocked: {path!r}")
        elif event in blocked:
            raise PermissionError(f"sandbox: {event} is blocked")
        elif event in ("os.kill", "os.killpg") and not allow_subprocesses and args[0] not in (own_pid, 0):
            raise PermissionError("sandbox: signalling other processes is blocked")
        elif event == "import" and args[0] in blocked_modules:
            raise ImportError(f"sandbox: importing {args[0]} is blocked")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the run's directory is blocked")

    sys.addaudithook(hook)


def confine(os_tools, cfg, report, workdir, uid, *, owns_workdir):
    """Apply this process's own layers (uid, no_new_privs, rlimits, syscall filter, audit hook), recording them in
    ``report``; then forget ctypes, so that nothing of it is left for the code that runs next. The judge
    (``owns_workdir=False``) also becomes non-dumpable: no ``/proc/<pid>/mem``, ``fd`` or ``environ`` of it is open
    to the program, even under the same uid."""
    if os.geteuid() == 0 and uid is not None and cfg["os_layers"]:
        try:
            if report["private_root"] or readable_as(uid, stdlib_dirs()):
                if owns_workdir:
                    os.chown(workdir, uid, uid)
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                report["uid"] = uid
            else:
                report["notes"].append("uid not dropped: the standard library is not readable by another uid")
        except OSError as e:
            report["notes"].append(f"uid not dropped: {e}")
    if not os_tools:
        os_tools.update(load_libc(report))
    libc = os_tools.get("libc")
    if libc is not None and not owns_workdir:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if libc is not None and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        report["no_new_privs"] = True
    import resource

    def limit(which, soft, hard=None):
        hard = soft if hard is None else hard
        current_hard = resource.getrlimit(which)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))

    limit(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1)
    limit(resource.RLIMIT_AS, cfg["memory_mb"] << 20)
    limit(resource.RLIMIT_FSIZE, cfg["disk_mb"] << 20)
    limit(resource.RLIMIT_NOFILE, 256)
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_MSGQUEUE, 0)
    if report["uid"] is not None:
        nproc = cfg["max_processes"]
    elif os.geteuid() != 0:
        nproc = user_task_count(os.geteuid()) + cfg["max_processes"]  # RLIMIT_NPROC counts the whole user
    else:
        nproc = None  # not enforced for root
    if nproc is not None:
        limit(resource.RLIMIT_NPROC, nproc)
        report["nproc_limit"] = nproc
    if cfg["syscall_filter"] is not None and libc is not None and report["no_new_privs"]:
        try:
            install_syscall_filter(os_tools, bytes.fromhex(cfg["syscall_filter"]))
            report["syscall_filter"] = True
        except OSError as e:
            report["notes"].append(str(e))
    os_tools.clear()
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    if cfg["python_guard"]:
        install_guard(workdir, cfg["allow_subprocesses"])
        report["python_guard"] = True


# ------------------------------------------------------------------------------------------------ the channel


class ProgramGone(BaseException):
    """The program exited, or broke the channel: the test fails, whatever it catches."""


class ProgramError(Exception):
    """An exception of the program's own class (a builtin exception keeps its class)."""


class LineReader:
    """Lines from a descriptor, each at most ``max_bytes`` long."""

    def __init__(self, fd, max_bytes):
        self.fd, self.max_bytes, self.buffer = fd, max_bytes, bytearray()

    def __call__(self):
        """The next line (without its newline), or None at end of input or past the size limit."""
        searched = 0
        while True:
            end = self.buffer.find(b"\n", searched)
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                return line
            searched = len(self.buffer)
            if searched > self.max_bytes:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(fd, message):
    write_all(fd, (json.dumps(message, separators=(",", ":")) + "\n").encode())


def exception_named(name):
    """The exception the judge raises for one the program raised: a builtin exception class by its name, else
    :class:`ProgramError`."""
    import builtins

    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls("raised by the program")
    return ProgramError(str(name)[:100])


class Remote:
    """A program object in the test (a function, a class, an instance, a generator): calling it, reading its
    attributes, its truth, length, items and iteration are round trips to the program, whose answers are values it
    could have returned anyway; it compares equal to nothing but itself."""

    __slots__ = ("_channel", "_ref")

    def __init__(self, channel, ref):
        self._channel, self._ref = channel, ref

    def __call__(self, *args, **kwargs):
        return self._channel.call(self._ref, args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._channel.getattr(self._ref, attr)

    def __bool__(self):
        return self._channel.special(self._ref, "bool")

    def __len__(self):
        return self._channel.special(self._ref, "len")

    def __iter__(self):
        return self._channel.special(self._ref, "iter")

    def __next__(self):
        return self._channel.special(self._ref, "next")

    def __getitem__(self, key):
        return self._channel.special(self._ref, "getitem", key)

    def __repr__(self):
        return f"<program object {self._ref}>"


class Channel:
    """The judge's end of the channel to the program: one request, one reply, every value as plain data."""

    def __init__(self, send_fd, receive_fd, max_bytes):
        self.send_fd, self.read_line = send_fd, LineReader(receive_fd, max_bytes)
        self.broken, self.calls, self.sequence = None, 0, 0
        self.remotes, self.names = {}, {}
        self.wire = Wire(step=1, export=self._export, resolve=self._resolve)

    def _export(self, obj):
        return obj._ref if type(obj) is Remote and obj._channel is self else None

    def _resolve(self, ref):
        if "handle" not in ref:
            raise ValueError("the program sent a name")
        remote = self.remotes.get(ref["handle"])
        if remote is None:
            remote = self.remotes[ref["handle"]] = Remote(self, {"handle": ref["handle"]})
        return remote

    def fail(self, why):
        self.broken = self.broken or why
        raise ProgramGone(self.broken)

    def request(self, message):
        """Send one request and return its reply: the next line that is a JSON object with this request's
        number (lines that are not are skipped: stray writes of the program cannot break a correct answer)."""
        if self.broken:
            raise ProgramGone(self.broken)
        self.sequence += 1
        try:
            send(self.send_fd, dict(message, seq=self.sequence))
        except OSError:
            self.fail("the program exited")
        while True:
            line = self.read_line()
            if line is None:
                self.fail("the program exited or sent a line over the size limit")
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(reply) is dict and reply.get("seq") == self.sequence:
                return reply

    def decode(self, data):
        try:
            return self.wire.decode(data)
        except (ValueError, RecursionError, MemoryError):
            self.fail("malformed value")

    def lookup(self, name):
        """A name the test does not define: the program's (KeyError when it has none)."""
        if name in self.names:
            return self.names[name]
        reply = self.request({"op": "lookup", "name": name})
        if reply.get("callable") is True:
            remote = self.names[name] = Remote(self, {"name": name})
            return remote
        if "value" in reply:
            return self.decode([reply["value"]])[0]
        raise KeyError(name)

    def call(self, ref, args, kwargs):
        self.calls += 1
        try:
            encoded = self.wire.encode([*args, *kwargs.values()])
        except (TypeError, ValueError) as e:
            raise TypeError(f"cannot pass this to the program: {e}") from None
        reply = self.request({"op": "call", "ref": ref, "args": encoded, "kw": list(kwargs)})
        return self.result(reply, len(encoded))

    def getattr(self, ref, attr):
        return self.result(self.request({"op": "getattr", "ref": ref, "attr": attr}), 0)

    def special(self, ref, name, *args):
        try:
            encoded = self.wire.encode(list(args))
        except (TypeError, ValueError) as e:
            raise TypeError(f"cannot pass this to the program: {e}") from None
        return self.result(self.request({"op": name, "ref": ref, "args": encoded}), len(encoded))

    def result(self, reply, sent):
        """Apply the program's view of the arguments (a mutation), then return its value or raise its error."""
        returned = reply.get("args", [])
        if type(returned) is not list or len(returned) not in (0, sent):
            self.fail("malformed reply")
        if "raise" in reply:
            self.decode(returned)
            raise exception_named(reply["raise"])
        if "return" not in reply:
            self.fail("malformed reply")
        return self.decode([*returned, reply["return"]])[-1]


class TestNamespace(dict):
    """The globals of a test: its own names and the prompt's helpers; then, looked up when first missing, the
    program's stubs in the prompt, the builtins, and for ``modules`` (names the test uses only as
    ``name.attribute``) a standard module imported here, else nothing; every other name is the program's."""

    def __init__(self, channel, stubs, modules):
        super().__init__()
        self.channel, self.stubs, self.modules = channel, frozenset(stubs), frozenset(modules)

    def __missing__(self, name):
        import builtins

        if name not in self.stubs:
            if hasattr(builtins, name):
                raise KeyError(name)  # CPython then reads the builtins
            if name in self.modules:
                if name in sys.stdlib_module_names:
                    try:
                        self[name] = __import__(name)
                        return self[name]
                    except ImportError:
                        pass
                raise KeyError(name)
        return self.channel.lookup(name)


def define_helpers(statements, namespace):
    """Run the prompt's helpers (a list of top-level statements' sources) in ``namespace``; one that fails is left
    out."""
    for statement in statements:
        try:
            exec(compile(statement, "prompt.py", "exec"), namespace)
        except Exception:
            pass


def run_judge(cfg, os_tools, report, workdir, fds):
    """The judge process: run the test against the program, write the verdict, exit."""
    status = 0
    try:
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        report = dict(report, uid=None, notes=list(report["notes"]))
        confine(os_tools, cfg, report, workdir, cfg["judge_uid"], owns_workdir=False)
        os.chdir("/")
        chunks = []
        while chunk := os.read(fds["test"], 1 << 16):
            chunks.append(chunk)
        os.close(fds["test"])
        job = json.loads(b"".join(chunks).decode("utf-8", "surrogatepass"))
        channel = Channel(fds["call_w"], fds["reply_r"], cfg["max_message_bytes"])
        namespace = TestNamespace(channel, cfg["stubs"], job["modules"])
        import builtins

        namespace.update({"__name__": "__main__", "__builtins__": builtins})
        define_helpers(cfg["helpers"], namespace)
        verdict = {
            "passed": False,
            "calls": 0,
            "note": "",
            "uid": report["uid"],
            "syscall_filter": report["syscall_filter"],
        }
        try:
            exec(compile(job["test"], "test.py", "exec"), namespace)
            verdict["passed"] = channel.broken is None
            verdict["note"] = channel.broken or ""
        except BaseException as e:
            verdict["note"] = channel.broken or f"{type(e).__name__}: {e}"
        verdict["calls"] = channel.calls
        verdict["note"] = verdict["note"][:MAX_NOTE]
        send(fds["verdict"], verdict)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    os._exit(status)


def serve(namespace, receive_fd, send_fd, max_bytes):
    """The program's end of the channel: answer the judge's lookups, calls and attribute reads until it is done."""
    handles, handle_ids = {}, {}

    def export(obj):
        key = handle_ids.get(id(obj))
        if key is None:
            key = handle_ids[id(obj)] = len(handles) + 1
            handles[key] = obj
        return {"handle": key}

    def resolve(ref):
        if "handle" in ref:
            return handles[ref["handle"]]
        return namespace[ref["name"]]

    wire = Wire(step=-1, export=export, resolve=resolve)
    read_line = LineReader(receive_fd, max_bytes)
    while (line := read_line()) is not None:
        request = json.loads(line)
        if request["op"] == "lookup":
            name = request["name"]
            if name not in namespace:
                reply = {"missing": True}
            elif callable(namespace[name]):
                reply = {"callable": True}
            else:
                try:
                    reply = {"value": wire.encode([namespace[name]])[0]}
                except (TypeError, ValueError, RecursionError):
                    reply = {"missing": True}
            send(send_fd, dict(reply, seq=request["seq"]))
            continue
        args = []
        try:
            target = resolve(request["ref"])
            if request["op"] == "getattr":
                value = getattr(target, request["attr"])
            elif request["op"] == "call":
                args = wire.decode(request["args"])
                positional = len(args) - len(request["kw"])
                value = target(*args[:positional], **dict(zip(request["kw"], args[positional:])))
            else:
                args = wire.decode(request["args"])
                value = SPECIAL[request["op"]](target, *args)
            encoded = wire.encode([*args, value])
            reply = {"args": encoded[:-1], "return": encoded[-1]}
        except Exception as e:  # SystemExit and the like end the program, as they would in plain Python
            try:
                reply = {"args": wire.encode(args), "raise": type(e).__name__}
            except Exception:
                reply = {"raise": type(e).__name__}
        send(send_fd, dict(reply, seq=request["seq"]))


def run_program(cfg, os_tools, report, workdir, program, fds):
    """The program process: confine, report, run the program, then (assert tests) serve the judge."""
    confine(os_tools, cfg, report, workdir, cfg["uid"], owns_workdir=True)
    import traceback  # (imported by the supervisor, before the audit hook: importing under it costs ~15 ms)

    os.write(fds["status"], (json.dumps(report) + "\n").encode())
    os.close(fds["status"])
    try:
        code = compile(program, "program.py", "exec")
    except (SyntaxError, ValueError) as e:  # the parent checked the syntax already; another interpreter may differ
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        os._exit(1)
    sys.argv[:] = ["program.py"]  # as `python program.py` would set it (not this file's path)
    if report["packages"]:  # after the standard library, so a listed package cannot shadow a standard module
        sys.path.append(report["packages"])
    namespace = {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__}
    define_helpers(cfg["helpers"], namespace)
    status = 0
    try:
        exec(code, namespace)
        if "call_r" in fds:
            serve(namespace, fds["call_r"], fds["reply_w"], 1 << 30)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status if 0 <= status <= 255 else 1)


def supervise(cfg, os_tools, report, workdir, program, fds, in_pid_ns):
    """Fork the judge (assert tests) and the program, give each only its own descriptors, and wait: for the
    judge's verdict (assert tests) or the program's exit status (stdin/stdout tests)."""
    import resource  # noqa: F401 - once, before the forks (confine uses it in each)
    import traceback  # noqa: F401 - for the program's errors, before any audit hook

    judge = None
    if "test" in fds:
        fds["call_r"], fds["call_w"] = os.pipe()
        fds["reply_r"], fds["reply_w"] = os.pipe()
        judge = os.fork()
        if judge == 0:
            for name in ("status", "call_r", "reply_w"):
                os.close(fds.pop(name))
            run_judge(cfg, os_tools, report, workdir, fds)
        for name in ("test", "verdict", "call_w", "reply_r"):
            os.close(fds.pop(name))
    child = os.fork()
    if child == 0:
        run_program(cfg, os_tools, report, workdir, program, fds)
    for fd in fds.values():
        os.close(fd)
    awaited = judge if judge is not None else child
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # as a PID namespace's init, reap every orphan too
        except ChildProcessError:
            os._exit(1)
        if pid == awaited:
            break
    if judge is not None:
        # The judge is done, its end of the channel closed: the program sees the end of input and exits (flushing
        # its output) within moments; whatever is left is killed (with the namespace, or here).
        for _ in range(100):
            try:
                if os.waitpid(child, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.001)
        else:
            if not in_pid_ns:
                os.kill(child, signal.SIGKILL)
    os._exit(0 if judge is not None else exit_code(status))


def main():
    with open("sandbox.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink("sandbox.json")
    with open("program.py", "rb") as f:
        # Compiled from the decoded text, as the parent checked it: a coding cookie is ignored on both sides (from
        # bytes, `# coding: utf-7` would make the child run what the parent read as a comment).
        program = f.read().decode("utf-8", "surrogatepass")
    fds = {name: cfg.pop(f"{name}_fd") for name in ("status", "test", "verdict") if cfg.get(f"{name}_fd") is not None}
    workdir = os.getcwd()
    report = {
        "euid": os.geteuid(),
        "namespaces": [],
        "private_root": False,
        "readonly_root": False,
        "private_tmp": False,
        "exposed": [],
        "packages": None,
        "uid": None,
        "judge_uid": None,
        "nproc_limit": None,
        "no_new_privs": False,
        "syscall_filter": False,
        "tmpfs_inodes": None,
        "pty_limit": None,
        "ipc_limits": False,
        "python_guard": False,
        "notes": [],
    }
    os_tools = load_libc(report) if cfg["os_layers"] else {}
    in_pid_ns = mounts_ok = False
    if os_tools and os.geteuid() == 0:
        exposed = interpreter_files()
        if os_tools["libc"].unshare(sum(CLONE.values())) == 0:
            report["namespaces"] = list(CLONE)
        else:
            for name, flag in CLONE.items():
                if os_tools["libc"].unshare(flag) == 0:
                    report["namespaces"].append(name)
                else:
                    report["notes"].append(f"unshare {name}: {os.strerror(os_tools['ctypes'].get_errno())}")
        if "ipc" in report["namespaces"]:
            try:  # our own IPC namespace's limits (its sysctls are per namespace)
                for name, value in IPC_LIMITS:
                    with open("/proc/sys/" + name, "w") as f:
                        f.write(value)
                report["ipc_limits"] = True
            except OSError as e:
                report["notes"].append(f"IPC limits: {e}")
        if "mnt" in report["namespaces"]:
            try:  # never propagate our mounts to the host
                mount(os_tools, None, "/", None, MS_REC | MS_PRIVATE)
                mounts_ok = True
            except OSError as e:
                report["notes"].append(str(e))
        if "pid" in report["namespaces"]:
            alive_r, alive_w = os.pipe()
            child = os.fork()
            if child:  # stays outside; our exit tells the parent that the whole namespace is gone
                os.close(alive_r)
                for fd in fds.values():
                    os.close(fd)
                # The parent's SIGTERM means "stop": kill the init; the kernel then kills every process of the
                # namespace and the init's exit (our waitpid) waits for them all.
                signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
                _, status = os.waitpid(child, 0)
                os._exit(exit_code(status))
            os.close(alive_w)
            os_tools["libc"].prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # our parent dies -> we die -> the namespace dies
            import select

            if select.select([alive_r], [], [], 0)[0]:
                os._exit(137)  # the parent died before the prctl took effect
            os.close(alive_r)
            in_pid_ns = True
        if mounts_ok:
            try:
                private_root(os_tools, cfg, workdir, report, in_pid_ns, exposed)
            except OSError as e:
                report["notes"].append(f"no private root: {e}")
                report["packages"] = None  # its binds went with it
                os_tools["libc"].umount2(os.fsencode(workdir), MNT_DETACH)
                try:
                    shared_view(os_tools, cfg, workdir, report, in_pid_ns)
                except OSError as e:
                    report["notes"].append(str(e))
    os.chdir(workdir)
    if cfg["packages"] and report["packages"] is None:  # no mount namespace (or its binds failed)
        link_packages(cfg["packages"], LINKED_PACKAGES_DIR)
        report["packages"] = os.path.join(workdir, LINKED_PACKAGES_DIR)
    report["judge_uid"] = cfg["judge_uid"] if "test" in fds else None
    supervise(cfg, os_tools, report, workdir, program, fds, in_pid_ns)


if __package__:  # imported as a module of the package
    from ._plain_values import Wire
else:  # loaded by the sandbox's bootstrap, which loaded the codec first (see the module docstring)
    from _plain_values import Wire
