//! Chunked payloads (format 5, `squeeze_format::chunks`): a blob compressed
//! as independent chunks behind a table, so a read of a few sectors decodes
//! one chunk instead of the blob. Both halves live here: the compression
//! a job runs ([`compress_chunked`], from `engine::run_job`), and the
//! decoding of one chunk or of a whole payload for the read path and the
//! cleaner.

use crate::{decompress, CodecError, Compressor};
use squeeze_format::chunks::{encode_table, Chunk, ChunkTable, CHUNK_ENTRY_BYTES};
use squeeze_format::{checksum, CodecId};

/// Compresses `src` as independent chunks of `chunk_bytes` (the last may be
/// shorter) with `compressor` into a chunked payload: the table, then each
/// chunk as a frame, or raw where the frame would not be shorter than the
/// chunk. Returns the payload and the table's CRC-32C (the record's payload
/// CRC), or None when the payload would exceed `limit` bytes. `scratch` is
/// the codec's output buffer.
pub fn compress_chunked(
    compressor: &mut dyn Compressor,
    src: &[u8],
    chunk_bytes: usize,
    limit: usize,
    scratch: &mut Vec<u8>,
) -> Result<Option<(Vec<u8>, u32)>, CodecError> {
    let n = src.len().div_ceil(chunk_bytes);
    let table = n * CHUNK_ENTRY_BYTES;
    if table >= limit {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(limit.min(src.len() / 2 + table));
    out.resize(table, 0);
    let mut entries = Vec::with_capacity(n);
    for chunk in src.chunks(chunk_bytes) {
        // One byte under the chunk: a frame is never as long as its chunk,
        // so the stored length tells a raw chunk from a frame.
        let at = out.len();
        match compressor.compress(chunk, scratch, chunk.len() - 1)? {
            Some(len) => out.extend_from_slice(&scratch[..len]),
            None => out.extend_from_slice(chunk),
        }
        if out.len() > limit {
            return Ok(None);
        }
        let stored = &out[at..];
        entries.push((stored.len() as u32, checksum::crc32c(stored)));
    }
    let (t, crc) = encode_table(&entries);
    out[..table].copy_from_slice(&t);
    Ok(Some((out, crc)))
}

/// Decodes one chunk (its `stored` bytes, already checked) into `out`, its
/// raw length: a copy for a raw chunk, else a frame of `codec`.
pub fn decompress_chunk(
    codec: CodecId,
    chunk: &Chunk,
    stored: &[u8],
    out: &mut [u8],
) -> Result<(), CodecError> {
    debug_assert_eq!(out.len(), chunk.raw_len());
    if chunk.is_raw() {
        out.copy_from_slice(stored);
        Ok(())
    } else {
        decompress(codec, stored, out)
    }
}

/// Decodes a whole chunked `payload` (checked against its table) into
/// `out`, the record's raw bytes.
pub fn decompress_chunked(
    codec: CodecId,
    table: &ChunkTable,
    payload: &[u8],
    out: &mut [u8],
) -> Result<(), CodecError> {
    for c in table.chunks() {
        let at = c.sectors.start as usize * squeeze_format::SECTOR_SIZE;
        decompress_chunk(
            codec,
            c,
            &payload[c.stored.clone()],
            &mut out[at..at + c.raw_len()],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{new_compressor, testdata, Algorithm};
    use squeeze_format::chunks::table_len;
    use squeeze_format::SECTOR_SIZE;

    #[test]
    fn chunked_payloads_round_trip_with_raw_chunks_among_frames() {
        // 10 sectors: compressible, then random (stored raw), then text.
        let mut src = testdata::text(4 * SECTOR_SIZE, 1);
        src.extend(testdata::random(4 * SECTOR_SIZE, 2));
        src.extend(testdata::text(2 * SECTOR_SIZE, 3));
        for codec in [
            CodecId::Zstd,
            CodecId::Lz4,
            CodecId::Deflate,
            CodecId::Snappy,
        ] {
            let mut c = new_compressor(Algorithm::new(codec, 1));
            let mut scratch = Vec::new();
            let (p, crc) =
                compress_chunked(c.as_mut(), &src, 4 * SECTOR_SIZE, src.len(), &mut scratch)
                    .unwrap()
                    .expect("fits");
            let t = ChunkTable::decode(&p, 10, 4, p.len() as u32, crc).unwrap();
            let raw: Vec<bool> = t.chunks().iter().map(Chunk::is_raw).collect();
            assert_eq!(raw, vec![false, true, false], "{codec:?}");
            let mut out = vec![0u8; src.len()];
            decompress_chunked(codec, &t, &p, &mut out).unwrap();
            assert_eq!(out, src, "{codec:?}");
            // One chunk alone.
            let c2 = &t.covering(8..9)[0];
            let mut one = vec![0u8; c2.raw_len()];
            decompress_chunk(codec, c2, &p[c2.stored.clone()], &mut one).unwrap();
            assert_eq!(one, src[8 * SECTOR_SIZE..]);
        }
    }

    #[test]
    fn a_chunked_payload_over_its_limit_is_refused() {
        let src = testdata::random(8 * SECTOR_SIZE, 9);
        let mut c = new_compressor(Algorithm::new(CodecId::Zstd, 3));
        let mut scratch = Vec::new();
        let r = compress_chunked(c.as_mut(), &src, 2 * SECTOR_SIZE, src.len(), &mut scratch);
        assert!(r.unwrap().is_none());
        let fits = src.len() + table_len(8, 2);
        let (p, _) = compress_chunked(c.as_mut(), &src, 2 * SECTOR_SIZE, fits, &mut scratch)
            .unwrap()
            .unwrap();
        assert_eq!(p.len(), fits);
    }
}
