"""The code sandbox's first process (see :mod:`grpo_family.rewards.code` for the layers it applies).

:class:`~grpo_family.rewards.code.Sandbox` runs this file by path, ``python -I -S -B -X utf8 <this file>``, in the
run's directory, where it left ``sandbox.json`` (settings, with an assert test's probes and the setup they need) and
``program.py``. It applies the layers the code module's docstring lists, writes a JSON report of what it applied as
the first line of the status pipe, runs the program and, for an assert test, writes the probes' values there as
plain data (``values <json>``). Pass or fail is decided by the parent, never here.

Standard library only, and nothing of the package is imported: ``-I -S`` keep site-packages (and the package) out
of reach, and the rewards directory must never be on ``sys.path`` (its ``code.py`` and ``math.py`` would shadow the
standard library for the program), so :func:`encode_value` is read from ``_plain_values.py`` next to this file.
Imported as a module (tests, tools) it runs nothing.
"""

import json
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CLONE = {"net": 0x40000000, "mnt": 0x00020000, "pid": 0x20000000, "ipc": 0x08000000, "uts": 0x04000000}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}  # only where the number is known to be right


def exit_code(status):
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def load_libc(report):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.unshare.argtypes = [ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        return ctypes, libc
    except Exception as e:
        report["notes"].append(f"ctypes unavailable: {e}")
        return None, None


def mount(ctypes, libc, source, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else os.fsencode(s)

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def readonly_root(ctypes, libc):
    # mount_setattr("/", AT_RECURSIVE, {MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID}): every mount below / read-only.
    number = SYS_MOUNT_SETATTR.get(os.uname().machine)
    if number is None:
        raise OSError("mount_setattr syscall number unknown on this architecture")

    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    attr = MountAttr(0x1 | 0x2, 0, 0, 0)
    ret = libc.syscall(
        ctypes.c_long(number),
        ctypes.c_int(-100),
        ctypes.c_char_p(b"/"),
        ctypes.c_uint(0x8000),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount_setattr: {os.strerror(err)}")


def blocked_ancestor(path):
    # The first directory on the way to ``path`` that others cannot enter (e.g. /root, mode 0700), or None.
    parts = os.path.realpath(path).split(os.sep)[1:]
    current = ""
    for part in parts:
        current += os.sep + part
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def stdlib_dirs():
    dirs = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)})
    return [d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs if o != d)]


def setup_mounts(ctypes, libc, cfg, workdir, report, in_pid_ns):
    try:
        readonly_root(ctypes, libc)
        report["readonly_root"] = True
    except OSError as e:
        report["notes"].append(str(e))
    # Cover a directory others cannot enter on the way to the standard library, binding the library back.
    by_ancestor = {}
    for d in stdlib_dirs():
        ancestor = blocked_ancestor(d)
        if ancestor is not None:
            by_ancestor.setdefault(ancestor, []).append(d)
    for ancestor, dirs in by_ancestor.items():
        fds = [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in dirs]
        mount(ctypes, libc, "tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=256,mode=755")
        for d, fd in fds:
            os.makedirs(d, mode=0o755, exist_ok=True)
            mount(ctypes, libc, f"/proc/self/fd/{fd}", d, None, MS_BIND | MS_REC)
            mount(ctypes, libc, None, d, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.close(fd)
        report["hidden"].append(ancestor)
    size = f"size={cfg['disk_mb']}m,nr_inodes={cfg['tmpfs_inodes']}"
    mount(ctypes, libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    if not report["readonly_root"]:
        for shared in ("/var/tmp", "/dev/shm"):
            if os.path.isdir(shared):
                mount(ctypes, libc, "tmpfs", shared, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
    if os.path.isdir(workdir):  # not under /tmp: a tmpfs of its own
        mount(ctypes, libc, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=700")
    else:
        os.makedirs(workdir, mode=0o700)
    report["private_tmp"] = True
    report["tmpfs_inodes"] = cfg["tmpfs_inodes"]
    if os.path.isdir("/dev/pts"):
        # A devpts instance of our own: at most max_ptys ptys, instead of a share of the machine's pool.
        mount(
            ctypes,
            libc,
            "devpts",
            "/dev/pts",
            "devpts",
            MS_NOSUID | MS_NOEXEC,
            f"newinstance,ptmxmode=0666,mode=0620,max={cfg['max_ptys']}",
        )
        if not os.path.islink("/dev/ptmx"):
            mount(ctypes, libc, "/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)
        report["pty_limit"] = cfg["max_ptys"]
    if in_pid_ns:
        mount(ctypes, libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


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


def install_syscall_filter(ctypes, libc, program):
    # The BPF program was compiled by libseccomp in the parent; load it with prctl (no_new_privs is set).
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")


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


def main():
    with open("sandbox.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink("sandbox.json")
    with open("program.py", "rb") as f:
        program = f.read()
    status_fd, setup, probes = cfg["status_fd"], cfg.pop("setup"), cfg.pop("probes")
    syscall_filter = cfg.pop("syscall_filter")
    workdir = os.getcwd()
    report = {
        "euid": os.geteuid(),
        "namespaces": [],
        "readonly_root": False,
        "private_tmp": False,
        "hidden": [],
        "uid": None,
        "nproc_limit": None,
        "no_new_privs": False,
        "syscall_filter": False,
        "tmpfs_inodes": None,
        "pty_limit": None,
        "python_guard": False,
        "notes": [],
    }
    ctypes, libc = load_libc(report) if cfg["os_layers"] else (None, None)
    in_pid_ns = mounts_ok = False
    if libc is not None and os.geteuid() == 0:
        if libc.unshare(sum(CLONE.values())) == 0:
            report["namespaces"] = list(CLONE)
        else:
            for name, flag in CLONE.items():
                if libc.unshare(flag) == 0:
                    report["namespaces"].append(name)
                else:
                    report["notes"].append(f"unshare {name}: {os.strerror(ctypes.get_errno())}")
        if "mnt" in report["namespaces"]:
            try:  # never propagate our mounts to the host
                mount(ctypes, libc, None, "/", None, MS_REC | MS_PRIVATE)
                mounts_ok = True
            except OSError as e:
                report["notes"].append(str(e))
        if "pid" in report["namespaces"]:
            alive_r, alive_w = os.pipe()
            child = os.fork()
            if child:  # stays outside; our exit tells the parent that the whole namespace is gone
                os.close(alive_r)
                # The parent's SIGTERM means "stop": kill the init; the kernel then kills every process of the
                # namespace and the init's exit (our waitpid) waits for them all.
                signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
                _, status = os.waitpid(child, 0)
                os._exit(exit_code(status))
            os.close(alive_w)
            libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # our parent dies -> we die -> the namespace dies
            import select

            if select.select([alive_r], [], [], 0)[0]:
                os._exit(137)  # the parent died before the prctl took effect
            os.close(alive_r)
            in_pid_ns = True
        if mounts_ok:
            try:
                setup_mounts(ctypes, libc, cfg, workdir, report, in_pid_ns)
            except OSError as e:
                report["notes"].append(str(e))
        if in_pid_ns:  # we are the namespace's init: run the program in a child, reap, exit with its status
            child = os.fork()
            if child:
                while True:
                    try:
                        pid, status = os.waitpid(-1, 0)
                    except ChildProcessError:
                        os._exit(1)
                    if pid == child:
                        os._exit(exit_code(status))
    os.chdir(workdir)
    uid = cfg["uid"]
    if os.geteuid() == 0 and uid is not None and cfg["os_layers"]:
        try:
            if report["hidden"] or readable_as(uid, stdlib_dirs()):
                os.chown(workdir, uid, uid)
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                report["uid"] = uid
            else:
                report["notes"].append("uid not dropped: the standard library is not readable by another uid")
        except OSError as e:
            report["notes"].append(f"uid not dropped: {e}")
    if libc is None:
        ctypes, libc = load_libc(report)
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
    if report["uid"] is not None:
        nproc = cfg["max_processes"]
    elif os.geteuid() != 0:
        nproc = user_task_count(os.geteuid()) + cfg["max_processes"]  # RLIMIT_NPROC counts the whole user
    else:
        nproc = None  # not enforced for root
    if nproc is not None:
        limit(resource.RLIMIT_NPROC, nproc)
        report["nproc_limit"] = nproc
    if syscall_filter is not None and libc is not None and report["no_new_privs"]:
        try:
            install_syscall_filter(ctypes, libc, bytes.fromhex(syscall_filter))
            report["syscall_filter"] = True
        except OSError as e:
            report["notes"].append(str(e))
    del ctypes, libc, syscall_filter
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    import traceback  # imported before the guard so that errors are always reported

    if cfg["python_guard"]:
        install_guard(workdir, cfg["allow_subprocesses"])
        report["python_guard"] = True
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    del cfg
    try:
        code = compile(program, "program.py", "exec")
    except (SyntaxError, ValueError) as e:  # the parent checked the syntax already; another interpreter may differ
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        os._exit(1)
    sys.argv[:] = ["program.py"]  # as `python program.py` would set it (not this file's path)
    namespace = {"__name__": "__main__", "__file__": "program.py", "__builtins__": __builtins__}
    values, status = None, 0
    try:
        exec(code, namespace)
        if probes is not None:
            # Assert tests: only the values of the test's calls into the program leave this interpreter; the
            # trusted side compares them (this process never sees an assert or an expected value).
            exec(compile(setup, "test_setup.py", "exec"), namespace)
            values = []
            for probe in probes:
                try:
                    values.append(["value", encode_value(eval(compile(probe, "test.py", "eval"), namespace))])
                except BaseException as e:
                    values.append(["error", type(e).__name__])
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
    if values is not None:
        try:
            line = json.dumps(values)
        except BaseException:
            line = json.dumps([["error", "encoding"]] * len(probes))
        os.write(status_fd, b"values " + line.encode() + b"\n")
    os._exit(status if 0 <= status <= 255 else 1)


def _load_encode_value():
    """``_plain_values.encode_value``, executed from its file (see the module docstring for why not imported)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_plain_values.py")
    namespace = {"__name__": "_plain_values"}
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace["encode_value"]


if __name__ == "__main__":
    encode_value = _load_encode_value()
    main()
else:
    from ._plain_values import encode_value  # noqa: F401 - main()'s global when imported as a module
