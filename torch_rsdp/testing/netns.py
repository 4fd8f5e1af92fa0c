"""Emulated nodes on one Linux host: one network namespace per node, joined by a switch.

    from torch_rsdp.testing.netns import EmulatedNodes, enter

    with EmulatedNodes(2, rate="1gbit") as nodes:
        # start processes; each one calls enter(nodes.netns_name(i)) before anything else
        # and finds its peers at nodes.node_addr(j), the launcher at nodes.store_addr
        ...

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2 (`ip`, and `tc` for a rate); a delay
also needs a C compiler (`cc`, once per host) and /dev/net/tun.
Only the standard library is imported here: a freshly started process loads this file to
switch namespaces before torch is imported (see `enter`).

Layout (every name starts with "rsdp-<tag>-", tag random per instance):

    root namespace            switch namespace rsdp-<tag>-sw         node namespace rsdp-<tag>-n<i>
    rsdp-<tag>-up  <--veth-->  rsdp-<tag>-us -+
    10.a.b.1/24 (store_addr)                  bridge rsdp-<tag>-br
                               rsdp-<tag>-s<i> -+  <--veth-->  rsdp-<tag>-v<i> 10.a.b.(10+i)/24

Why a dedicated switch namespace instead of a bridge in the root namespace: frames crossing
a bridge traverse the host's iptables FORWARD chain when br_netfilter is loaded
(net.bridge.bridge-nf-call-iptables=1 is its default), and hosts with Docker set that chain's
policy to DROP, which would silently cut node-to-node traffic. A fresh namespace has empty
tables. The launcher stays in the root namespace and hosts the c10d TCPStore; the uplink veth
gives it an address on the same /24 that every node reaches directly. The uplink is not
rate-limited: store traffic is small and not part of the emulated node link.

Rate limit: tbf on the egress of BOTH ends of each node's link, i.e. node -> switch on the node
end and switch -> node on the switch end, so each node has a full-duplex link of `rate` per
direction, like a NIC.

Delay: with `delay`, each node's link is a pair of TAP devices instead of a veth pair
(rsdp-<tag>-v<i> in the node, rsdp-<tag>-s<i> on the bridge), and one relay process
(link_delay.c, built on first use) copies frames between the two halves of every link, each
`delay` after it arrived. A message between two nodes crosses two links, so it arrives
2 x `delay` after it left. The kernel's netem would do the same inside the kernel, but it is a
build option some kernels leave out; the relay behaves alike on every host.

Cleanup: `__exit__` removes everything even when the body raised; an atexit hook and
SIGTERM/SIGHUP handlers do the same for instances still open when the process ends. Every
instance writes a registry file (owner pid + start time) before creating anything, so
`cleanup_stale()` can remove what a crashed (SIGKILLed) earlier run left behind without
touching instances of processes that are still running.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

PREFIX = "rsdp-"
REGISTRY_DIR = "/run/rsdp-netns"
NETNS_DIR = "/var/run/netns"

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MNT_DETACH = 2


class NetnsError(RuntimeError):
    pass


# ------------------------------------------------------------------------------ helpers


def _run(*args: str, check: bool = True) -> str:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def parse_rate(rate: str) -> int:
    """tc rate syntax -> bits per second: '1gbit' -> 10**9, '100mbit', '500kbit', '125mbps'
    (bps = bytes per second, as in tc); SI multiples like tc's."""
    s = rate.strip().lower()
    for suffix, mult in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3),
                         ("bit", 1), ("tbps", 8 * 10**12), ("gbps", 8 * 10**9),
                         ("mbps", 8 * 10**6), ("kbps", 8 * 10**3), ("bps", 8)):
        if s.endswith(suffix):
            try:
                value = float(s[: -len(suffix)])
            except ValueError:
                break
            if value > 0:
                return int(value * mult)
            break
    raise ValueError(f"bad rate {rate!r} (use tc syntax, e.g. 1gbit, 100mbit)")


def parse_delay(delay: str) -> int:
    """tc time syntax -> nanoseconds: '250us' -> 250_000, '1ms', '0.5ms', '2s'."""
    s = delay.strip().lower()
    for suffix, mult in (("usec", 10**3), ("msec", 10**6), ("sec", 10**9), ("us", 10**3),
                         ("ms", 10**6), ("s", 10**9)):
        if s.endswith(suffix):
            try:
                value = float(s[: -len(suffix)])
            except ValueError:
                break
            if value >= 0:
                return int(round(value * mult))
            break
    raise ValueError(f"bad delay {delay!r} (use tc syntax, e.g. 250us, 1ms)")


def _netns_list() -> list[str]:
    try:
        out = _run("ip", "netns", "list")
    except (OSError, NetnsError):  # no iproute2, or not allowed: nothing of ours can exist
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links(netns: str | None = None) -> list[str]:
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["-o", "link", "show"]
    try:
        out = _run(*cmd, check=False)
    except OSError:
        return []
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _tag_of(name: str) -> str | None:
    if not name.startswith(PREFIX):
        return None
    parts = name.split("-")
    return parts[1] if len(parts) >= 3 else None


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22: starttime
    except (OSError, IndexError):
        return None


def _register(tag: str, subnet: str) -> None:
    # written aside and renamed: a cleanup_stale() elsewhere must never read half an entry
    # (it would take the instance for a crashed one)
    tmp_dir = os.path.join(REGISTRY_DIR, "tmp")
    os.makedirs(tmp_dir, exist_ok=True)
    tmp = os.path.join(tmp_dir, f"{tag}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {_proc_start_time(os.getpid())} {subnet}\n")
    os.replace(tmp, os.path.join(REGISTRY_DIR, tag))


def _hosts_path(tag: str) -> str:
    return os.path.join(REGISTRY_DIR, "hosts", tag)


def _registry() -> dict[str, tuple[int, str, str]]:
    out = {}
    try:
        names = [n for n in os.listdir(REGISTRY_DIR)
                 if os.path.isfile(os.path.join(REGISTRY_DIR, n))]
    except FileNotFoundError:
        return out
    for tag in names:
        try:
            with open(os.path.join(REGISTRY_DIR, tag)) as f:
                pid, start, subnet = f.read().split()
            out[tag] = (int(pid), start, subnet)
        except (OSError, ValueError):
            out[tag] = (0, "", "")
    return out


def _owner_alive(entry: tuple[int, str, str] | None) -> bool:
    return entry is not None and entry[0] > 0 and _proc_start_time(entry[0]) == entry[1]


def _destroy(tag: str) -> list[str]:
    """Removes every link and namespace named rsdp-<tag>-*, then the registry file.

    Links are deleted explicitly (synchronously) before their namespaces: deleting a
    namespace only schedules the destruction of its devices, and a namespace that a process
    still sits in (a rank that has not exited yet) lives on until that process is gone.
    """
    pre = f"{PREFIX}{tag}-"
    removed = []
    spaces = [n for n in _netns_list() if n.startswith(pre)]
    for ns in [None] + spaces:
        for link in _links(ns):
            if link.startswith(pre):
                cmd = ["ip"] + (["-n", ns] if ns else []) + ["link", "del", link]
                if subprocess.run(cmd, capture_output=True).returncode == 0:
                    removed.append(link)
    for ns in spaces:
        if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
            removed.append(ns)
    for path in (_hosts_path(tag), os.path.join(REGISTRY_DIR, tag)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return removed


def leftovers() -> list[str]:
    """Names of every rsdp- namespace, and every rsdp- link in the root namespace."""
    return ([n for n in _netns_list() if n.startswith(PREFIX)]
            + [n for n in _links() if n.startswith(PREFIX)])


def cleanup_stale() -> list[str]:
    """Removes rsdp- namespaces and links whose creating process is gone (crashed runs).

    Instances of processes that are still running are left alone. Returns what was removed.
    """
    reg = _registry()
    tags = {t for t in (_tag_of(n) for n in _netns_list() + _links()) if t} | set(reg)
    removed = []
    for tag in sorted(tags):
        if not _owner_alive(reg.get(tag)):
            removed += _destroy(tag)
    return removed


_AVAILABLE: bool | None = None


def namespaces_available() -> bool:
    """True when this process may create network namespaces and veth pairs (tried once)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = False
        if os.geteuid() == 0 and sys.platform.startswith("linux"):
            tag = secrets.token_hex(2)
            try:
                _register(tag, "0.0.0.0/32")
                _run("ip", "netns", "add", f"{PREFIX}{tag}-probe")
                _run("ip", "link", "add", f"{PREFIX}{tag}-pa", "type", "veth", "peer", "name",
                     f"{PREFIX}{tag}-pb", "netns", f"{PREFIX}{tag}-probe")
                _AVAILABLE = os.path.exists(os.path.join(NETNS_DIR, f"{PREFIX}{tag}-probe"))
            except (OSError, NetnsError, subprocess.SubprocessError):
                pass
            finally:
                try:
                    _destroy(tag)
                except (OSError, NetnsError, subprocess.SubprocessError):
                    pass
    return _AVAILABLE


# ------------------------------------------------------------------------------ entering


def enter(netns_name: str, hostname: str | None = None) -> None:
    """Moves the calling process into network namespace `netns_name`, like `ip netns exec`.

    Call it first thing in a fresh process, before torch (or anything else) starts threads:
    setns() moves only the calling thread, and only threads created afterwards inherit it.
    Also gives the process a private mount namespace with a /sys of the new network
    namespace (UCX and others list interfaces under /sys/class/net) and, when the
    EmulatedNodes wrote one, an /etc/hosts naming every node's address (reverse lookups of
    peers succeed, as on a cluster); with `hostname` also a private UTS namespace with that
    host name (so a node identity derived from the host name differs per emulated node).
    /dev/shm stays shared, as on one machine.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} for netns {netns_name!r}: {os.strerror(err)}")

    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        print(f"netns.enter: {threads} threads already exist; only the calling thread and "
              f"threads it creates later are in {netns_name!r}", file=sys.stderr)
    fd = os.open(os.path.join(NETNS_DIR, netns_name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Make every mount a slave first, so that replacing /sys does not propagate to the host.
    check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    flags = MS_RDONLY if os.statvfs("/sys").f_flag & os.ST_RDONLY else 0
    libc.umount2(b"/sys", MNT_DETACH)  # may fail when /sys is not a mount point: fine
    check(libc.mount(netns_name.encode(), b"/sys", b"sysfs", flags, None), "mount sysfs")
    hosts = _hosts_path(_tag_of(netns_name) or "")
    if os.path.isfile(hosts) and os.path.isfile("/etc/hosts"):
        check(libc.mount(hosts.encode(), b"/etc/hosts", None, MS_BIND, None), "bind /etc/hosts")
    if hostname:
        check(libc.unshare(CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
        socket.sethostname(hostname)


# ------------------------------------------------------------------------------ the nodes


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _run("ip", "-4", "-o", "addr", "show").splitlines():
        toks = line.split()
        if "inet" in toks:
            nets.append(ipaddress.ip_network(toks[toks.index("inet") + 1], strict=False))
    route_types = {"local", "broadcast", "unicast", "unreachable", "blackhole", "prohibit",
                   "throw", "multicast", "anycast", "nat"}
    for line in _run("ip", "-4", "route", "show", "table", "all").splitlines():
        toks = line.split()
        if not toks:
            continue
        dest = toks[1] if toks[0] in route_types and len(toks) > 1 else toks[0]
        if dest == "default":
            continue
        try:
            nets.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            pass
    for _pid, _start, subnet in _registry().values():  # instances being set up right now
        try:
            nets.append(ipaddress.ip_network(subnet))
        except ValueError:
            pass
    return [n for n in nets if n.prefixlen > 0]


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    rng = random.SystemRandom()
    for _ in range(2000):
        net = ipaddress.ip_network(f"10.{rng.randrange(256)}.{rng.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError("no free /24 in 10.0.0.0/8 on this host")


_LIVE: dict[str, "EmulatedNodes"] = {}
_HANDLERS_INSTALLED = False


def _cleanup_live() -> None:
    for nodes in list(_LIVE.values()):
        if nodes.owner_pid == os.getpid():
            nodes.close()


def _install_handlers() -> None:
    """atexit + SIGTERM/SIGHUP: remove what is still open when the process ends."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_cleanup_live)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        prev = signal.getsignal(sig)

        def handler(signum, frame, prev=prev):
            _cleanup_live()
            if callable(prev):
                prev(signum, frame)
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04


def _open_tap(name: str) -> int:
    """A non-blocking descriptor of a new TAP device `name` in this namespace, with a
    virtio-net header and TCP segmentation offload, as a virtual machine's (link_delay.c says
    why); the device goes away when the last descriptor is closed."""
    import fcntl
    import struct
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(),
                                               IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    except OSError:
        os.close(fd)
        raise
    return fd


def _relay_binary() -> str:
    """link_delay.c compiled once per host and source (cached under REGISTRY_DIR)."""
    import hashlib
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "link_delay.c")
    with open(src, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    binary = os.path.join(REGISTRY_DIR, "bin", f"link_delay-{digest}")
    if not os.path.exists(binary):
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        tmp = f"{binary}.{os.getpid()}.{threading.get_ident()}"
        cc = os.environ.get("CC", "cc")
        try:
            _run(cc, "-O2", "-o", tmp, src)
        except OSError as e:
            raise NetnsError(f"a link delay needs a C compiler ({cc}): {e}") from e
        os.replace(tmp, binary)  # atomic: a concurrent build ends with the same file
    return binary


class EmulatedNodes:
    """`num_nodes` network namespaces on one bridge; see the module docstring.

    rate: tc rate per direction of each node's link (e.g. "1gbit"), None = unlimited.
    delay: added to every frame, in each direction, on each node's link (e.g. "250us", "1ms";
    node to node is twice this), None = none.
    """

    def __init__(self, num_nodes: int, rate: str | None = None, delay: str | None = None,
                 mtu: int = 1500):
        if not 1 <= num_nodes <= 99:
            raise ValueError(f"num_nodes must be in 1..99, got {num_nodes}")
        self.num_nodes = num_nodes
        self.rate = rate
        self.rate_bps = parse_rate(rate) if rate else None
        self.delay = delay
        self.delay_ns = parse_delay(delay) if delay else 0
        self.mtu = mtu
        self._relay: subprocess.Popen | None = None
        self.owner_pid = os.getpid()
        self.tag = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self._open = False

    # -- names and addresses
    def _name(self, what: str) -> str:
        return f"{PREFIX}{self.tag}-{what}"

    def netns_name(self, i: int) -> str:
        self._check_node(i)
        return self._name(f"n{i}")

    @property
    def switch_netns(self) -> str:
        return self._name("sw")

    def ifname(self, i: int) -> str:
        """The interface of node i inside its namespace (GLOO_SOCKET_IFNAME, UCX_NET_DEVICES)."""
        self._check_node(i)
        return self._name(f"v{i}")

    def node_addr(self, i: int) -> str:
        self._check_node(i)
        return str(self.subnet.network_address + 10 + i)

    @property
    def store_addr(self) -> str:
        """Root-namespace address reachable from every node (bind the launcher's TCPStore)."""
        return str(self.subnet.network_address + 1)

    def _check_node(self, i: int) -> None:
        if not self._open:
            raise NetnsError("EmulatedNodes is not open (use it as a context manager)")
        if not 0 <= i < self.num_nodes:
            raise IndexError(f"node {i} out of range 0..{self.num_nodes - 1}")

    def describe(self) -> str:
        link = ", ".join(x for x in (self.rate and f"rate {self.rate}",
                                     self.delay and f"delay {self.delay}") if x)
        return (f"{self.num_nodes} network namespaces {self._name('n*')} on {self.subnet}, "
                f"store at {self.store_addr}" + (f", links: {link}" if link else ""))

    # -- life cycle
    def __enter__(self) -> "EmulatedNodes":
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> None:
        if self._open:
            return
        _install_handlers()
        existing = set(_netns_list()) | set(_links())
        for _ in range(100):
            self.tag = secrets.token_hex(2)
            if not any(_tag_of(n) == self.tag for n in existing) and \
                    not os.path.exists(os.path.join(REGISTRY_DIR, self.tag)):
                break
        self.subnet = _pick_subnet()
        _register(self.tag, str(self.subnet))  # before creating anything: see cleanup_stale
        _LIVE[self.tag] = self
        self._open = True
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        sw, br, plen = self.switch_netns, self._name("br"), self.subnet.prefixlen
        _run("ip", "netns", "add", sw)
        _run("ip", "-n", sw, "link", "set", "lo", "up")
        _run("ip", "-n", sw, "link", "add", br, "type", "bridge", "forward_delay", "0",
             "stp_state", "0")
        up, us = self._name("up"), self._name("us")
        _run("ip", "link", "add", up, "mtu", str(self.mtu), "type", "veth", "peer", "name", us,
             "netns", sw)
        _run("ip", "addr", "add", f"{self.store_addr}/{plen}", "dev", up)
        _run("ip", "-n", sw, "link", "set", us, "master", br, "up")
        _run("ip", "link", "set", up, "up")
        taps: list[int] = []  # with a delay: node half, switch half, per link
        handed = False
        try:
            for i in range(self.num_nodes):
                ns, v, s = self.netns_name(i), self.ifname(i), self._name(f"s{i}")
                _run("ip", "netns", "add", ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                # TCP's default restarts slow start after an idle gap of one round trip, and a
                # collective's messages come in bursts with gaps: behind a delay each burst would
                # pay extra round trips that a data-centre fabric (RDMA, or hosts tuned for
                # long-lived connections) does not
                _run("ip", "netns", "exec", ns, "sh", "-c",
                     "echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle")
                if self.delay_ns:
                    for name, where in ((v, ns), (s, sw)):
                        taps.append(_open_tap(name))
                        _run("ip", "link", "set", name, "mtu", str(self.mtu), "netns", where)
                else:
                    _run("ip", "link", "add", v, "mtu", str(self.mtu), "netns", ns, "type", "veth",
                         "peer", "name", s, "netns", sw)
                _run("ip", "-n", ns, "addr", "add", f"{self.node_addr(i)}/{plen}", "dev", v)
                _run("ip", "-n", sw, "link", "set", s, "master", br, "up")
                _run("ip", "-n", ns, "link", "set", v, "up")
                self._shape(ns, v)
                self._shape(sw, s)
            _run("ip", "-n", sw, "link", "set", br, "up")
            handed = True  # _start_relay closes them, whatever happens
            if taps:
                self._start_relay(taps)
        finally:
            if not handed:  # a step above failed: the devices go with their descriptors
                for fd in taps:
                    os.close(fd)
        self._write_hosts()
        self._wait_up([(None, up)] + [(self.netns_name(i), self.ifname(i))
                                      for i in range(self.num_nodes)])

    def _write_hosts(self) -> None:
        """The /etc/hosts that enter() shows inside the nodes: the host's entries plus one
        name per node (its namespace name, also its host name) and the launcher."""
        try:
            with open("/etc/hosts") as f:
                base = f.read()
        except OSError:
            base = "127.0.0.1 localhost\n"
        names = [(self.store_addr, self._name("launcher"))]
        names += [(self.node_addr(i), self.netns_name(i)) for i in range(self.num_nodes)]
        # also the IPv4-mapped IPv6 form: dual-stack sockets (c10d's TCPStore) report peers
        # as ::ffff:a.b.c.d, and without an entry their reverse lookup falls through to DNS
        lines = [f"{a} {n}" for a, n in names] + [f"::ffff:{a} {n}" for a, n in names]
        os.makedirs(os.path.dirname(_hosts_path(self.tag)), exist_ok=True)
        with open(_hosts_path(self.tag), "w") as f:
            f.write(base.rstrip("\n") + "\n# emulated nodes\n" + "\n".join(lines) + "\n")

    def _shape(self, ns: str, dev: str) -> None:
        if not self.rate:
            return
        rate_bytes = self.rate_bps // 8
        # burst: >= 1 ms at rate and > a 64 KiB GSO packet (tbf would split larger ones).
        # limit: a NIC's default queue, 1000 full-size packets (12 ms at 1 Gbit/s, 120 ms
        # at 100 Mbit/s). A queue sized in time instead is short enough to drop packets of
        # a slow link that two rails share, and each TCP recovery then delays a collective
        # now and then: noise that no real NIC queue makes.
        burst = max(131072, rate_bytes // 1000)
        limit = max(2 * burst, 1000 * 1514)
        _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
             "rate", f"{self.rate_bps}bit", "burst", str(burst), "limit", str(limit))

    def _start_relay(self, taps: list[int]) -> None:
        """Starts the process that delays every link's frames (link_delay.c); the TAP
        devices live as long as it holds their descriptors."""
        try:
            self._relay = subprocess.Popen(
                [_relay_binary(), str(self.delay_ns), *map(str, taps)],
                pass_fds=taps, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            # a real switch does not wait for the hosts' CPUs: the relay runs ahead of the
            # ranks sharing this machine's cores, so that a frame's delay is the one asked for
            # (where raising a priority is not allowed, it runs as it is, a little later)
            try:
                os.setpriority(os.PRIO_PROCESS, self._relay.pid, -10)
            except PermissionError:
                pass
            ready = self._relay.stdout.readline()
        finally:
            for fd in taps:
                os.close(fd)
        if ready.strip() != b"ready":
            raise NetnsError(f"the link delay relay did not start (exit {self._relay.poll()})")

    def _wait_up(self, links, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(links)
        while pending:
            ns, dev = pending[0]
            out = _run("ip", *(["-n", ns] if ns else []), "-br", "link", "show", "dev", dev)
            # a TAP device has no operational state to report ("UNKNOWN"): its carrier is up
            # once its flags show LOWER_UP
            if " UP " in f" {out} " or (" UNKNOWN " in f" {out} " and "LOWER_UP" in out):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise NetnsError(f"link {dev} in {ns or 'root namespace'} not up: {out.strip()}")
            time.sleep(0.05)

    def close(self) -> None:
        """Removes every namespace, link and qdisc of this instance (idempotent)."""
        if not self._open:
            return
        self._open = False
        _LIVE.pop(self.tag, None)
        if self._relay is not None:
            self._relay.terminate()
            try:
                self._relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait()
            self._relay.stdout.close()
            self._relay = None
        _destroy(self.tag)


# ------------------------------------------------------------------------------ as a command


def main(argv: list[str]) -> int:
    """`python netns.py NODE COMMAND...`: runs COMMAND inside emulated node NODE (a namespace
    name of a live EmulatedNodes, also the node's host name), through `sh -c` as ssh runs a
    remote command. This is the remote shell of programs that start their own processes per
    host, where the host names are the namespace names: Open MPI's mpirun
    (`--mca plm_rsh_agent "python .../netns.py"`, `-H <node name>:<ranks>,...`) and
    benchmarks/multinode_peers.py's oneCCL ranks. Leading options (ssh's `-x` and the like)
    are ignored. Run as a file, this module imports nothing outside the standard library."""
    args = list(argv)
    while args and args[0].startswith("-"):
        args.pop(0)
    if len(args) < 2:
        print("usage: netns.py NODE COMMAND...", file=sys.stderr)
        return 2
    node, command = args[0], " ".join(args[1:])
    if _tag_of(node) is None or not os.path.exists(os.path.join(NETNS_DIR, node)):
        print(f"netns.py: {node!r} is not the namespace of a live emulated node",
              file=sys.stderr)
        return 255  # ssh's status for a connection that could not be made
    enter(node, hostname=node)
    os.execv("/bin/sh", ["sh", "-c", command])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
