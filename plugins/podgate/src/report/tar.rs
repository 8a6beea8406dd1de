//! A minimal ustar writer (regular files only): what `tar -xf` needs to
//! unpack the report, without a dependency or a `tar` binary in the image.

use std::io::Write;

const BLOCK: usize = 512;

fn octal(field: &mut [u8], v: u64) {
    // Width-1 octal digits, NUL-terminated.
    let width = field.len() - 1;
    let s = format!("{v:0width$o}");
    let bytes = s.as_bytes();
    let start = bytes.len().saturating_sub(width);
    if let Some(dst) = field.get_mut(..width) {
        dst.copy_from_slice(bytes.get(start..).unwrap_or_default());
    }
    if let Some(last) = field.last_mut() {
        *last = 0;
    }
}

fn header(name: &str, size: u64, mtime: u64) -> Result<[u8; BLOCK], String> {
    let mut h = [0u8; BLOCK];
    let name_b = name.as_bytes();
    // ustar: up to 155 bytes of prefix (a directory part) and 100 of name.
    let (prefix, base) = if name_b.len() <= 100 {
        (&[][..], name_b)
    } else {
        let split = name
            .char_indices()
            .filter(|(i, c)| *c == '/' && *i <= 155 && name_b.len() - i - 1 <= 100)
            .map(|(i, _)| i)
            .next()
            .ok_or_else(|| format!("path too long for the archive: {name}"))?;
        (
            name_b.get(..split).unwrap_or_default(),
            name_b.get(split + 1..).unwrap_or_default(),
        )
    };
    let put = |h: &mut [u8; BLOCK], at: usize, b: &[u8]| {
        if let Some(dst) = h.get_mut(at..at + b.len()) {
            dst.copy_from_slice(b);
        }
    };
    put(&mut h, 0, base);
    if let Some(f) = h.get_mut(100..108) {
        octal(f, 0o600);
    }
    if let Some(f) = h.get_mut(108..116) {
        octal(f, 0);
    }
    if let Some(f) = h.get_mut(116..124) {
        octal(f, 0);
    }
    if let Some(f) = h.get_mut(124..136) {
        octal(f, size);
    }
    if let Some(f) = h.get_mut(136..148) {
        octal(f, mtime);
    }
    put(&mut h, 148, b"        ");
    put(&mut h, 156, b"0");
    put(&mut h, 257, b"ustar\x0000");
    put(&mut h, 345, prefix);
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    put(&mut h, 148, s.as_bytes());
    Ok(h)
}

/// Write `files` (archive path, content) as one tar stream.
pub fn write(out: &mut impl Write, files: &[(String, Vec<u8>)], mtime: u64) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    for (name, body) in files {
        out.write_all(&header(name, body.len() as u64, mtime)?)
            .map_err(io)?;
        out.write_all(body).map_err(io)?;
        let pad = (BLOCK - body.len() % BLOCK) % BLOCK;
        out.write_all(&vec![0u8; pad]).map_err(io)?;
    }
    out.write_all(&[0u8; 2 * BLOCK]).map_err(io)?;
    out.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fields_and_checksum() {
        let h = header("r/a.txt", 5, 1).unwrap();
        assert_eq!(&h[..7], b"r/a.txt");
        assert_eq!(&h[124..136], b"00000000005\0");
        assert_eq!(&h[257..265], b"ustar\x0000");
        let mut copy = h;
        copy[148..156].copy_from_slice(b"        ");
        let sum: u64 = copy.iter().map(|b| u64::from(*b)).sum();
        assert_eq!(&h[148..156], format!("{sum:06o}\0 ").as_bytes());
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(50));
        let h = header(&long, 0, 0).unwrap();
        assert_eq!(&h[..50], "f".repeat(50).as_bytes());
        assert_eq!(&h[345..465], "d".repeat(120).as_bytes());
        let mut buf = Vec::new();
        write(&mut buf, &[("x".into(), b"hello".to_vec())], 0).unwrap();
        assert_eq!(buf.len(), 512 * 4);
    }
}
