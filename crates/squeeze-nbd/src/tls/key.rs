//! What a private key is, for the error when the TLS library cannot sign
//! with it: "RSA key of 1024 bits", "EC key on curve secp256k1", "Ed448
//! key". Reads just enough DER (PKCS#1, PKCS#8, SEC1) to name the type and
//! size; bytes it does not understand make it say less, never panic.

use rustls::pki_types::PrivateKeyDer;

/// The key types and sizes rustls with aws-lc-rs can sign with, for error
/// messages (aws-lc-rs: RSA moduli of 2048 to 8192 bits; rustls: ECDSA on
/// P-256, P-384, P-521; Ed25519).
pub(crate) const USABLE_KEYS: &str =
    "RSA keys of 2048 to 8192 bits, EC keys on P-256, P-384 or P-521, and Ed25519 keys";
pub(crate) const RSA_BITS_MIN: usize = 2048;
pub(crate) const RSA_BITS_MAX: usize = 8192;

/// A key's type and size as far as the DER tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Rsa {
        bits: Option<usize>,
    },
    RsaPss {
        bits: Option<usize>,
    },
    Ec {
        curve: Option<String>,
    },
    Ed25519,
    /// Any other algorithm, by name or dotted OID.
    Other(String),
    Unknown,
}

impl KeyKind {
    pub(crate) fn of(key: &PrivateKeyDer<'_>) -> KeyKind {
        match key {
            PrivateKeyDer::Pkcs1(k) => KeyKind::Rsa {
                bits: rsa_modulus_bits(k.secret_pkcs1_der()),
            },
            PrivateKeyDer::Sec1(k) => KeyKind::Ec {
                curve: sec1_curve(k.secret_sec1_der()),
            },
            PrivateKeyDer::Pkcs8(k) => pkcs8_kind(k.secret_pkcs8_der()),
            _ => KeyKind::Unknown,
        }
    }

    /// Why the TLS library refuses this key, when its type or size says
    /// so (None: a key of a usable type and size, refused for another
    /// reason the library gives).
    pub(crate) fn why_unusable(&self) -> Option<String> {
        match self {
            KeyKind::Rsa { bits: Some(b) } if *b < RSA_BITS_MIN => {
                Some(format!("fewer than {RSA_BITS_MIN} bits"))
            }
            KeyKind::Rsa { bits: Some(b) } if *b > RSA_BITS_MAX => {
                Some(format!("more than {RSA_BITS_MAX} bits"))
            }
            KeyKind::RsaPss { .. } => Some("RSA-PSS (id-RSASSA-PSS) keys are not supported".into()),
            KeyKind::Ec { curve: Some(c) }
                if !matches!(c.as_str(), "P-256" | "P-384" | "P-521") =>
            {
                Some(format!("{c} is not a supported curve"))
            }
            KeyKind::Other(_) => Some("not a supported key type".into()),
            _ => None,
        }
    }
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyKind::Rsa { bits: Some(b) } => write!(f, "RSA key of {b} bits"),
            KeyKind::Rsa { bits: None } => write!(f, "RSA key of unreadable size"),
            KeyKind::RsaPss { bits: Some(b) } => write!(f, "RSA-PSS key of {b} bits"),
            KeyKind::RsaPss { bits: None } => write!(f, "RSA-PSS key"),
            KeyKind::Ec { curve: Some(c) } => write!(f, "EC key on curve {c}"),
            KeyKind::Ec { curve: None } => write!(f, "EC key on an unnamed curve"),
            KeyKind::Ed25519 => write!(f, "Ed25519 key"),
            KeyKind::Other(name) => write!(f, "{name} key"),
            KeyKind::Unknown => write!(f, "key of unrecognised type"),
        }
    }
}

/// One DER element: (tag, contents, rest of the input).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The next element if it carries tag `want`: its contents and what follows.
fn der_tagged(input: &[u8], want: u8) -> Option<(&[u8], &[u8])> {
    let (tag, body, rest) = der(input)?;
    (tag == want).then_some((body, rest))
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;

/// Bits in an unsigned big-endian integer (DER INTEGER contents).
fn integer_bits(v: &[u8]) -> Option<usize> {
    let i = v.iter().position(|&b| b != 0)?;
    Some((v.len() - i) * 8 - v[i].leading_zeros() as usize)
}

/// PKCS#1 RSAPrivateKey: SEQUENCE { version, modulus, ... }.
fn rsa_modulus_bits(pkcs1: &[u8]) -> Option<usize> {
    let (body, _) = der_tagged(pkcs1, SEQUENCE)?;
    let (_version, rest) = der_tagged(body, INTEGER)?;
    let (n, _) = der_tagged(rest, INTEGER)?;
    integer_bits(n)
}

/// SEC1 ECPrivateKey: SEQUENCE { version, privateKey, [0] curve OID, ... }.
fn sec1_curve(sec1: &[u8]) -> Option<String> {
    let (body, _) = der_tagged(sec1, SEQUENCE)?;
    let (_, _version, rest) = der(body)?;
    let (_, _private, mut rest) = der(rest)?;
    while let Some((tag, value, more)) = der(rest) {
        if tag == 0xa0 {
            let (tag, oid, _) = der(value)?;
            return (tag == OID).then(|| curve_name(oid));
        }
        rest = more;
    }
    None
}

/// PKCS#8 PrivateKeyInfo: SEQUENCE { version, SEQUENCE { algorithm OID,
/// parameters }, OCTET STRING privateKey, ... }.
fn pkcs8_kind(pkcs8: &[u8]) -> KeyKind {
    let parse = || -> Option<KeyKind> {
        let (body, _) = der_tagged(pkcs8, SEQUENCE)?;
        let (_, _version, rest) = der(body)?;
        let (alg, rest) = der_tagged(rest, SEQUENCE)?;
        let (oid, params) = der_tagged(alg, OID)?;
        let inner = der(rest).and_then(|(t, v, _)| (t == OCTET_STRING).then_some(v));
        Some(match oid {
            // rsaEncryption, 1.2.840.113549.1.1.1
            [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01] => KeyKind::Rsa {
                bits: inner.and_then(rsa_modulus_bits),
            },
            // id-RSASSA-PSS, 1.2.840.113549.1.1.10
            [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a] => KeyKind::RsaPss {
                bits: inner.and_then(rsa_modulus_bits),
            },
            // id-ecPublicKey, 1.2.840.10045.2.1: the curve is the parameter.
            [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01] => KeyKind::Ec {
                curve: der(params)
                    .filter(|(t, _, _)| *t == OID)
                    .map(|(_, c, _)| curve_name(c))
                    .or_else(|| inner.and_then(sec1_curve)),
            },
            [0x2b, 0x65, 0x70] => KeyKind::Ed25519,
            [0x2b, 0x65, 0x71] => KeyKind::Other("Ed448".into()),
            [0x2b, 0x65, 0x6e] => KeyKind::Other("X25519 (key agreement only)".into()),
            [0x2b, 0x65, 0x6f] => KeyKind::Other("X448 (key agreement only)".into()),
            [0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01] => KeyKind::Other("DSA".into()),
            [0x2a, 0x86, 0x48, 0xce, 0x3e, 0x02, 0x01] => KeyKind::Other("DH".into()),
            other => KeyKind::Other(format!("OID {}", dotted(other))),
        })
    };
    parse().unwrap_or(KeyKind::Unknown)
}

fn curve_name(oid: &[u8]) -> String {
    match oid {
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07] => "P-256".into(),
        [0x2b, 0x81, 0x04, 0x00, 0x22] => "P-384".into(),
        [0x2b, 0x81, 0x04, 0x00, 0x23] => "P-521".into(),
        [0x2b, 0x81, 0x04, 0x00, 0x0a] => "secp256k1".into(),
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x01] => "P-192".into(),
        [0x2b, 0x81, 0x04, 0x00, 0x21] => "P-224".into(),
        other => format!("OID {}", dotted(other)),
    }
}

/// An OID's dotted form ("1.3.132.0.10").
fn dotted(oid: &[u8]) -> String {
    let mut parts = Vec::new();
    let mut acc: u64 = 0;
    for (i, &b) in oid.iter().enumerate() {
        if acc > u64::MAX >> 7 {
            return "(malformed)".into();
        }
        acc = (acc << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if parts.is_empty() {
                let first = (acc / 40).min(2);
                parts.push(first);
                parts.push(acc - first * 40);
            } else {
                parts.push(acc);
            }
            acc = 0;
        } else if i == oid.len() - 1 {
            return "(malformed)".into();
        }
    }
    parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_oids() {
        assert_eq!(dotted(&[0x2b, 0x81, 0x04, 0x00, 0x0a]), "1.3.132.0.10");
        assert_eq!(
            dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01]),
            "1.2.840.113549.1.1.1"
        );
        assert_eq!(dotted(&[0x2b, 0x81]), "(malformed)");
    }

    #[test]
    fn integer_bit_lengths() {
        assert_eq!(integer_bits(&[0x00, 0x80, 0x00]), Some(16));
        assert_eq!(integer_bits(&[0x01]), Some(1));
        assert_eq!(integer_bits(&[0x00]), None);
    }

    #[test]
    fn garbage_is_unknown_not_a_panic() {
        for bytes in [
            &[][..],
            &[0x30],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30, 0x03, 0x02, 0x01],
        ] {
            let k = PrivateKeyDer::Pkcs8(bytes.to_vec().into());
            assert_eq!(KeyKind::of(&k), KeyKind::Unknown);
            let _ = KeyKind::of(&PrivateKeyDer::Pkcs1(bytes.to_vec().into()));
            let _ = KeyKind::of(&PrivateKeyDer::Sec1(bytes.to_vec().into()));
        }
    }
}
