//! The kernel's own call graph, read from the image a VM booted: which functions call a given
//! function, by the direct `call rel32` (and tail `jmp rel32`) instructions in its text. The
//! test of `--callers` checks every reported call site against it: the instruction before the
//! return address must call the traced function, or a function that tail-jumps to it.
//!
//! The image is the cached package's `vmlinuz` (a bzImage): its compressed payload is found by
//! its magic and unpacked with the system's `zstd`, `xz` or `gzip`; the result is the linked
//! vmlinux (an ELF without symbols). Addresses are tied to it through the booted guest's
//! `/proc/kallsyms`: the KASLR offset is the guest's `_text` minus the image's first executable
//! segment.

use std::{
    collections::{BTreeSet, HashMap},
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
};

/// Compressed payloads a bzImage may hold: magic and the command that unpacks one stream.
const PAYLOADS: [(&[u8], &str, &[&str]); 3] = [
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", &["-dc"]),
    (
        &[0xfd, b'7', b'z', b'X', b'Z', 0],
        "xz",
        &["-dc", "--single-stream"],
    ),
    (&[0x1f, 0x8b, 0x08], "gzip", &["-dc"]),
];

/// The linked kernel inside `vmlinuz`.
pub fn vmlinux(vmlinuz: &Path) -> Result<Vec<u8>, String> {
    let image = std::fs::read(vmlinuz).map_err(|e| format!("{}: {e}", vmlinuz.display()))?;
    for (magic, tool, args) in PAYLOADS {
        let mut at = 0;
        while let Some(i) = image[at..].windows(magic.len()).position(|w| w == magic) {
            let start = at + i;
            at = start + 1;
            let Ok(mut child) = Command::new(tool)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
            else {
                break;
            };
            let mut stdin = child.stdin.take().expect("piped");
            let payload = image[start..].to_vec();

            // Written from a thread: the unpacked kernel fills the pipe the other way.
            let writer = std::thread::spawn(move || {
                let _ = stdin.write_all(&payload);
            });
            let out = child
                .wait_with_output()
                .map_err(|e| format!("{tool}: {e}"))?;
            let _ = writer.join();

            // Trailing data after the stream makes some tools complain: what counts is the ELF.
            if out.stdout.len() > 1 << 20 && out.stdout.starts_with(b"\x7fELF\x02\x01") {
                return Ok(out.stdout);
            }
        }
    }
    Err(format!(
        "{}: no zstd, xz or gzip payload unpacks to a 64-bit ELF",
        vmlinuz.display()
    ))
}

/// An executable segment of the image: its link address and bytes.
struct Segment {
    vaddr: u64,
    bytes: std::ops::Range<usize>,
}

/// The image's call graph, in the guest's addresses.
pub struct CallGraph {
    elf: Vec<u8>,
    text: Vec<Segment>,
    /// Guest address minus link address.
    offset: u64,
    /// The guest's text symbols, sorted by address.
    syms: Vec<(u64, String)>,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes(b[i..i + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

impl CallGraph {
    /// The graph of `elf` (from [`vmlinux`]) as booted, named by the guest's `kallsyms` text
    /// lines (`address type name`).
    pub fn new(elf: Vec<u8>, kallsyms: &str) -> Result<Self, String> {
        let (phoff, phentsize, phnum) = (
            u64_at(&elf, 0x20) as usize,
            u16_at(&elf, 0x36) as usize,
            u16_at(&elf, 0x38) as usize,
        );
        let mut text = Vec::new();
        for i in 0..phnum {
            let h = phoff + i * phentsize;
            let (ty, flags) = (u32_at(&elf, h), u32_at(&elf, h + 4));
            let (off, vaddr, filesz) = (
                u64_at(&elf, h + 8) as usize,
                u64_at(&elf, h + 16),
                u64_at(&elf, h + 32) as usize,
            );

            // PT_LOAD, executable.
            if ty == 1 && flags & 1 != 0 && off + filesz <= elf.len() {
                text.push(Segment {
                    vaddr,
                    bytes: off..off + filesz,
                });
            }
        }

        let first = text
            .first()
            .ok_or("no executable segment in the image")?
            .vaddr;
        let mut syms: Vec<(u64, String)> = kallsyms
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let a = u64::from_str_radix(it.next()?, 16).ok()?;
                let _ty = it.next()?;
                let n = it.next()?;

                // Module text is not in the image.
                it.next().is_none().then(|| (a, n.to_string()))
            })
            .collect();
        syms.sort();
        let guest_text = syms
            .iter()
            .find(|s| s.1 == "_text")
            .ok_or("no _text in the guest's kallsyms")?
            .0;
        Ok(CallGraph {
            elf,
            text,
            offset: guest_text.wrapping_sub(first),
            syms,
        })
    }

    /// The function holding guest address `a` (the last text symbol at or before it).
    pub fn function_at(&self, a: u64) -> Option<(u64, &str)> {
        let i = self.syms.partition_point(|s| s.0 <= a);
        self.syms
            .get(i.checked_sub(1)?)
            .map(|s| (s.0, s.1.as_str()))
    }

    /// Guest addresses of the text symbols named `name`.
    pub fn addresses_of(&self, name: &str) -> Vec<u64> {
        self.syms
            .iter()
            .filter(|s| s.1 == name)
            .map(|s| s.0)
            .collect()
    }

    /// `len` bytes of the image at guest address `a`, where it is text.
    fn bytes_at(&self, a: u64, len: usize) -> Option<&[u8]> {
        let link = a.wrapping_sub(self.offset);
        self.text.iter().find_map(|s| {
            let rel = link.checked_sub(s.vaddr)? as usize;
            (rel + len <= s.bytes.len()).then(|| &self.elf[s.bytes.start + rel..][..len])
        })
    }

    /// Where the `e8 rel32` call (or, `jmp`, the `e9 rel32` jump) ending at guest address
    /// `ret` goes; None if the bytes before `ret` are not one.
    fn branch_before(&self, ret: u64, jmp: bool) -> Option<u64> {
        let b = self.bytes_at(ret.checked_sub(5)?, 5)?;
        (b[0] == if jmp { 0xe9 } else { 0xe8 }).then(|| {
            ret.wrapping_add(i32::from_le_bytes(b[1..5].try_into().unwrap()) as i64 as u64)
        })
    }

    /// Every direct call (`jmp`: tail jump) into `targets` (guest addresses; a branch within
    /// 16 bytes of one counts, as a call past an `endbr` does) in the image: the guest address
    /// just after each.
    pub fn branches_to(&self, targets: &[u64], jmp: bool) -> Vec<u64> {
        let op = if jmp { 0xe9 } else { 0xe8 };
        let hits = |t: u64| {
            targets
                .iter()
                .any(|&x| t.wrapping_sub(x).wrapping_add(16) < 32)
        };
        let mut out = Vec::new();
        for s in &self.text {
            let code = &self.elf[s.bytes.clone()];
            for i in 0..code.len().saturating_sub(4) {
                if code[i] != op {
                    continue;
                }

                let rel = i32::from_le_bytes(code[i + 1..i + 5].try_into().unwrap()) as i64;
                let after = (s.vaddr + i as u64 + 5).wrapping_add(self.offset);
                if hits(after.wrapping_add(rel as u64)) {
                    out.push(after);
                }
            }
        }
        out
    }

    /// The callers of the function named `name` in the image: the functions holding a direct
    /// call of it, and those that tail-jump to it (whose own callers' return addresses then
    /// stand for its call sites).
    pub fn callers_of(&self, name: &str) -> Callers {
        let targets = self.addresses_of(name);
        let direct: BTreeSet<String> = self
            .branches_to(&targets, false)
            .into_iter()
            .filter_map(|a| self.function_at(a - 5).map(|f| f.1.to_string()))
            .collect();
        let mut tail = HashMap::new();
        for a in self.branches_to(&targets, true) {
            if let Some((start, f)) = self.function_at(a - 5) {
                tail.insert(start, f.to_string());
            }
        }
        Callers {
            targets,
            direct,
            tail,
        }
    }

    /// What the kernel's code says of the return address `ret` (guest) as a return from the
    /// function starting at `callee` (guest).
    pub fn link(&self, ret: u64, callee: u64) -> Link {
        let near = |t: u64| t.wrapping_sub(callee).wrapping_add(16) < 32;
        let Some(t) = self.branch_before(ret, false) else {
            // `call *%reg`, `call *%r8..15`, `call *disp8(%reg)`, `call *disp32(%rip|%reg)`.
            let indirect = [(2, 0xd0), (3, 0xd0), (3, 0x50), (6, 0x10), (6, 0x90)]
                .iter()
                .any(|&(len, modrm)| {
                    ret.checked_sub(len)
                        .and_then(|a| self.bytes_at(a, len as usize))
                        .is_some_and(|b| {
                            let i = usize::from(len == 3 && b[0] == 0x41);
                            b.get(i) == Some(&0xff)
                                && b.get(i + 1).is_some_and(|m| m & 0xf8 == modrm)
                        })
                });
            return if indirect {
                Link::Indirect
            } else {
                Link::Wrong
            };
        };
        if near(t) {
            return Link::Direct;
        }

        let Some((_, name)) = self.function_at(t) else {
            return Link::Wrong;
        };

        // A retpoline: the call of an indirect call thunk, target unknown to the image.
        if name.starts_with("__x86_indirect_") {
            return Link::Indirect;
        }

        // Tail calls: the function called jumps (or branches on a condition) to the callee,
        // or to a function that does, three deep at most.
        if self.tail_reaches(t, &near, 3) {
            Link::Tail
        } else {
            Link::Wrong
        }
    }

    /// Whether the code entered at `entry` (guest) reaches a target `near` accepts by tail
    /// jumps (`jmp rel32`, `jcc rel32`) between there and the end of its symbol, `depth`
    /// jumps deep at most. (The code after an entry within a symbol stands for the code that
    /// runs from it: a compiler's shared tails and split bodies enter symbols anywhere.)
    fn tail_reaches(&self, entry: u64, near: &dyn Fn(u64) -> bool, depth: u32) -> bool {
        let Some((start, _)) = self.function_at(entry) else {
            return false;
        };
        let next_sym = self.syms.partition_point(|s| s.0 <= entry);
        let end = self.syms.get(next_sym).map_or(entry + 4096, |s| s.0);
        if depth == 0 || end <= entry || end - entry > 1 << 20 {
            return false;
        }

        let start = start.max(entry);
        let Some(code) = self.bytes_at(start, (end - start) as usize) else {
            return false;
        };
        let rel_at = |i: usize| i32::from_le_bytes(code[i..i + 4].try_into().unwrap()) as i64;
        let targets: Vec<u64> = (0..code.len().saturating_sub(4))
            .filter_map(|i| {
                let at = start + i as u64;
                if code[i] == 0xe9 {
                    Some((at + 5).wrapping_add(rel_at(i + 1) as u64))
                } else if i + 6 <= code.len() && code[i] == 0x0f && code[i + 1] & 0xf0 == 0x80 {
                    Some((at + 6).wrapping_add(rel_at(i + 2) as u64))
                } else {
                    None
                }
            })
            // Jumps within the function are its own control flow.
            .filter(|&x| x < start || x >= end)
            .collect();
        targets.iter().any(|&x| near(x))
            || targets
                .iter()
                .any(|&x| self.tail_reaches(x, near, depth - 1))
    }

    /// How a reported call site (a return address in the guest) of the function `c` was made:
    /// `Some(true)` by a direct call of it, `Some(false)` by a call of one of the functions
    /// that tail-jump to it, None when the instruction before it is neither.
    pub fn site_of(&self, c: &Callers, ret: u64) -> Option<bool> {
        let callee = self.branch_before(ret, false)?;
        if c.targets
            .iter()
            .any(|&x| callee.wrapping_sub(x).wrapping_add(16) < 32)
        {
            return Some(true);
        }

        let (start, _) = self.function_at(callee)?;
        (callee.wrapping_sub(start) < 16 && c.tail.contains_key(&start)).then_some(false)
    }
}

/// A return address as the kernel's code explains it (see [`CallGraph::link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// After a direct call of the function.
    Direct,
    /// After a direct call of a function that tail-jumps (or branches) to it.
    Tail,
    /// After an indirect call (a register, memory, or a retpoline thunk): a call, of a target
    /// the image cannot name.
    Indirect,
    /// Not after a call that can reach the function.
    Wrong,
}

/// A function's callers in the image.
pub struct Callers {
    /// Its guest addresses.
    pub targets: Vec<u64>,
    /// The functions that call it directly.
    pub direct: BTreeSet<String>,
    /// The functions that tail-jump to it, by guest address.
    pub tail: HashMap<u64, String>,
}
