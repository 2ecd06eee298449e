//! iSCSI PDUs: the 48-byte basic header segment, additional header segments, the data segment
//! with its padding, and the optional CRC32C header and data digests.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const BHS_LEN: usize = 48;

pub mod op {
    // Initiator opcodes.
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_CMD: u8 = 0x01;
    pub const TASK_MGMT_REQ: u8 = 0x02;
    pub const LOGIN_REQ: u8 = 0x03;
    pub const TEXT_REQ: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT_REQ: u8 = 0x06;
    pub const SNACK: u8 = 0x10;
    // Target opcodes.
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RESP: u8 = 0x21;
    pub const TASK_MGMT_RESP: u8 = 0x22;
    pub const LOGIN_RESP: u8 = 0x23;
    pub const TEXT_RESP: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RESP: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const REJECT: u8 = 0x3F;
}

#[derive(Debug, thiserror::Error)]
pub enum PduError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data digest mismatch")]
    DataDigest { bhs: Box<[u8; BHS_LEN]> },
    #[error("data segment of {len} bytes exceeds the negotiated {max}")]
    TooLong { len: usize, max: usize },
}

#[derive(Clone, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Pdu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pdu(op {:#04x}, itt {:#x}, {} data bytes)",
            self.opcode(),
            self.itt(),
            self.data.len()
        )
    }
}

pub fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Where the 4-byte fields of the basic header segment sit (RFC 7143 section 11). One offset
/// holds different fields in different PDUs; each name says which.
pub mod at {
    pub const ITT: usize = 16;
    /// Target Transfer Tag (Data-Out, R2T, NOP, text, and "reserved" 0xFFFFFFFF elsewhere).
    pub const TTT: usize = 20;
    /// Expected Data Transfer Length of a SCSI Command.
    pub const EDTL: usize = 20;
    /// CmdSN in requests.
    pub const CMD_SN: usize = 24;
    /// StatSN in responses.
    pub const STAT_SN: usize = 24;
    /// ExpStatSN in requests.
    pub const EXP_STAT_SN: usize = 28;
    /// ExpCmdSN in responses.
    pub const EXP_CMD_SN: usize = 28;
    /// MaxCmdSN in responses.
    pub const MAX_CMD_SN: usize = 32;
    /// DataSN (Data-In, Data-Out), R2TSN (R2T), ExpDataSN (SCSI Response).
    pub const DATA_SN: usize = 36;
    /// Buffer Offset of Data-In, Data-Out and R2T.
    pub const BUFFER_OFFSET: usize = 40;
    /// Residual Count (Data-In, SCSI Response), Desired Data Transfer Length (R2T).
    pub const RESIDUAL: usize = 44;
    pub const DESIRED_LENGTH: usize = 44;
}

impl Pdu {
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = opcode;
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3F
    }
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }
    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }
    pub fn final_bit(&self) -> bool {
        self.bhs[1] & 0x80 != 0
    }
    pub fn lun(&self) -> [u8; 8] {
        self.bhs[8..16].try_into().expect("8 bytes")
    }
    pub fn itt(&self) -> u32 {
        get32(&self.bhs, at::ITT)
    }
    pub fn ttt(&self) -> u32 {
        get32(&self.bhs, at::TTT)
    }
    /// CmdSN of a request.
    pub fn cmd_sn(&self) -> u32 {
        get32(&self.bhs, at::CMD_SN)
    }
    /// ExpStatSN of a request.
    pub fn exp_stat_sn(&self) -> u32 {
        get32(&self.bhs, at::EXP_STAT_SN)
    }
    /// StatSN of a response.
    pub fn stat_sn(&self) -> u32 {
        get32(&self.bhs, at::STAT_SN)
    }
    /// MaxCmdSN of a response.
    pub fn max_cmd_sn(&self) -> u32 {
        get32(&self.bhs, at::MAX_CMD_SN)
    }
    /// Expected Data Transfer Length of a SCSI Command.
    pub fn expected_data_transfer_length(&self) -> u32 {
        get32(&self.bhs, at::EDTL)
    }
    /// The CDB of a SCSI Command (16 bytes; a longer one would come in an AHS).
    pub fn cdb(&self) -> &[u8] {
        &self.bhs[32..48]
    }
    /// DataSN of a Data-In or Data-Out.
    pub fn data_sn(&self) -> u32 {
        get32(&self.bhs, at::DATA_SN)
    }
    /// Buffer Offset of a Data-In, Data-Out or R2T.
    pub fn buffer_offset(&self) -> u32 {
        get32(&self.bhs, at::BUFFER_OFFSET)
    }
    /// Desired Data Transfer Length of an R2T.
    pub fn desired_length(&self) -> u32 {
        get32(&self.bhs, at::DESIRED_LENGTH)
    }
    pub fn set(&mut self, at: usize, v: u32) -> &mut Self {
        put32(&mut self.bhs, at, v);
        self
    }

    /// Reads one PDU. `max_data` bounds the data segment (our MaxRecvDataSegmentLength, or the
    /// login limit); digests are checked when negotiated.
    pub async fn read<R: AsyncRead + Unpin>(
        r: &mut R,
        header_digest: bool,
        data_digest: bool,
        max_data: usize,
    ) -> Result<Pdu, PduError> {
        let mut bhs = [0u8; BHS_LEN];
        r.read_exact(&mut bhs).await?;
        let (mut ahs, mut data, data_len) = segments(&bhs, max_data);
        r.read_exact(&mut ahs).await?;
        let mut d = [0u8; 4];
        if header_digest {
            r.read_exact(&mut d).await?;
            check_header(&bhs, &ahs, d)?;
        }
        check_length(data_len, max_data)?;
        r.read_exact(&mut data).await?;
        if data_digest && data_len > 0 {
            r.read_exact(&mut d).await?;
            check_data(&bhs, &data, d)?;
        }
        data.truncate(data_len);
        Ok(Pdu { bhs, ahs, data })
    }

    /// `read` for a blocking stream (a connection served by threads).
    pub fn read_blocking<R: std::io::Read>(
        r: &mut R,
        header_digest: bool,
        data_digest: bool,
        max_data: usize,
    ) -> Result<Pdu, PduError> {
        let mut bhs = [0u8; BHS_LEN];
        r.read_exact(&mut bhs)?;
        let (mut ahs, mut data, data_len) = segments(&bhs, max_data);
        r.read_exact(&mut ahs)?;
        let mut d = [0u8; 4];
        if header_digest {
            r.read_exact(&mut d)?;
            check_header(&bhs, &ahs, d)?;
        }
        check_length(data_len, max_data)?;
        r.read_exact(&mut data)?;
        if data_digest && data_len > 0 {
            r.read_exact(&mut d)?;
            check_data(&bhs, &data, d)?;
        }
        data.truncate(data_len);
        Ok(Pdu { bhs, ahs, data })
    }

    /// Serializes the PDU with its lengths, padding and digests.
    pub fn encode(&mut self, header_digest: bool, data_digest: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(BHS_LEN + self.ahs.len() + self.data.len() + 12);
        self.encode_into(&mut out, header_digest, data_digest);
        out
    }

    /// Appends the serialized PDU to `out` (a batch of PDUs to send in one write).
    pub fn encode_into(&mut self, out: &mut Vec<u8>, header_digest: bool, data_digest: bool) {
        let n = self.data.len();
        self.set_lengths(n);
        out.reserve(BHS_LEN + self.ahs.len() + n.div_ceil(4) * 4 + 8);
        let head = out.len();
        out.extend_from_slice(&self.bhs);
        out.extend_from_slice(&self.ahs);
        if header_digest {
            let crc = crc32c::crc32c(&out[head..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out.extend_from_slice(&self.data);
        out.extend_from_slice(Trailer::of(&self.data, data_digest).as_slice());
    }

    /// Sets the header's TotalAHSLength and DataSegmentLength (`n` bytes, without padding).
    fn set_lengths(&mut self, n: usize) {
        self.bhs[4] = (self.ahs.len() / 4) as u8;
        self.bhs[5..8].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
    }

    /// The bytes around a data segment `data` that the PDU does not hold: the header (BHS,
    /// AHS, header digest) with the segment's length, and what follows the segment (its
    /// padding and data digest). Sent as header, `data`, trailer, they are the PDU that
    /// [`encode`](Self::encode) makes with `data` as its segment, without copying it.
    pub fn frame(
        &mut self,
        data: &[u8],
        header_digest: bool,
        data_digest: bool,
    ) -> ([u8; BHS_LEN + 4], usize, Trailer) {
        debug_assert!(
            self.data.is_empty() && self.ahs.is_empty(),
            "frame is for a PDU whose segment is given apart"
        );
        self.set_lengths(data.len());
        let mut head = [0u8; BHS_LEN + 4];
        head[..BHS_LEN].copy_from_slice(&self.bhs);
        let mut head_len = BHS_LEN;
        if header_digest {
            head[BHS_LEN..].copy_from_slice(&crc32c::crc32c(&self.bhs).to_le_bytes());
            head_len += 4;
        }
        (head, head_len, Trailer::of(data, data_digest))
    }

    pub async fn write<W: AsyncWrite + Unpin>(&mut self, w: &mut W, hd: bool, dd: bool) -> std::io::Result<()> {
        let bytes = self.encode(hd, dd);
        w.write_all(&bytes).await
    }
}

/// What follows a data segment sent apart from its PDU ([`Pdu::frame`]): its padding and
/// data digest, if any.
pub struct Trailer {
    bytes: [u8; 8],
    len: usize,
}

impl Trailer {
    /// The padding of segment `data` to four bytes and, with `data_digest`, its CRC32C (of
    /// the data and padding); nothing after an empty segment.
    fn of(data: &[u8], data_digest: bool) -> Trailer {
        let n = data.len();
        let pad = n.div_ceil(4) * 4 - n;
        let mut trailer = Trailer {
            bytes: [0; 8],
            len: pad,
        };
        if data_digest && n > 0 {
            let crc = crc32c::crc32c_append(crc32c::crc32c(data), &[0u8; 3][..pad]);
            trailer.bytes[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
            trailer.len += 4;
        }
        trailer
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The DataSegmentLength a header announces (without padding).
pub fn data_segment_length(bhs: &[u8; BHS_LEN]) -> usize {
    ((bhs[5] as usize) << 16) | ((bhs[6] as usize) << 8) | bhs[7] as usize
}

/// Bytes on the wire of the PDU at the start of `buf` (header, AHS, digests, padded data),
/// once its Basic Header Segment is there; None before.
pub fn wire_len(buf: &[u8], header_digest: bool, data_digest: bool) -> Option<usize> {
    let bhs: &[u8; BHS_LEN] = buf.get(..BHS_LEN)?.try_into().ok()?;
    let data = data_segment_length(bhs);
    let digest = |on: bool| if on { 4 } else { 0 };
    Some(BHS_LEN + bhs[4] as usize * 4 + digest(header_digest) + data.div_ceil(4) * 4 + digest(data_digest && data > 0))
}

/// Buffers for the AHS and the padded data segment a header announces, and the data length.
/// A data segment over `max_data` gets no buffer: it is refused once the header digest (if
/// any) has shown the length can be trusted.
fn segments(bhs: &[u8; BHS_LEN], max_data: usize) -> (Vec<u8>, Vec<u8>, usize) {
    let ahs_len = bhs[4] as usize * 4;
    let data_len = data_segment_length(bhs);
    let padded = if data_len > max_data {
        0
    } else {
        data_len.div_ceil(4) * 4
    };
    (vec![0u8; ahs_len], vec![0u8; padded], data_len)
}

fn check_length(data_len: usize, max_data: usize) -> Result<(), PduError> {
    if data_len > max_data {
        return Err(PduError::TooLong {
            len: data_len,
            max: max_data,
        });
    }
    Ok(())
}

fn check_header(bhs: &[u8; BHS_LEN], ahs: &[u8], digest: [u8; 4]) -> Result<(), PduError> {
    let crc = crc32c::crc32c_append(crc32c::crc32c(bhs), ahs);
    if u32::from_le_bytes(digest) != crc {
        return Err(PduError::HeaderDigest);
    }
    Ok(())
}

fn check_data(bhs: &[u8; BHS_LEN], padded: &[u8], digest: [u8; 4]) -> Result<(), PduError> {
    if u32::from_le_bytes(digest) != crc32c::crc32c(padded) {
        return Err(PduError::DataDigest { bhs: Box::new(*bhs) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_with_digests_and_padding() {
        for (hd, dd) in [(false, false), (true, true), (true, false)] {
            let mut p = Pdu::new(op::SCSI_CMD);
            p.set(16, 0xABCD);
            p.data = b"hello".to_vec();
            let bytes = p.encode(hd, dd);
            assert_eq!(bytes.len(), 48 + 8 + if hd { 4 } else { 0 } + if dd { 4 } else { 0 });
            assert_eq!(wire_len(&bytes, hd, dd), Some(bytes.len()));
            assert_eq!(wire_len(&bytes[..47], hd, dd), None);
            let q = Pdu::read(&mut &bytes[..], hd, dd, 1024).await.unwrap();
            assert_eq!(q.data, b"hello");
            assert_eq!(q.itt(), 0xABCD);
        }
    }

    #[test]
    fn a_framed_segment_is_the_encoded_pdu_byte_for_byte() {
        for len in [0usize, 1, 2, 3, 4, 5, 4096, 4099, 262_144] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut whole = Pdu::new(op::SCSI_CMD);
                whole.set(16, 0x1234);
                let mut framed = whole.clone();
                whole.data = data.clone();
                let want = whole.encode(hd, dd);
                let (head, head_len, trailer) = framed.frame(&data, hd, dd);
                let got = [&head[..head_len], &data[..], trailer.as_slice()].concat();
                assert_eq!(got, want, "segment of {len} bytes, digests {hd}/{dd}");
            }
        }
    }

    #[tokio::test]
    async fn corruption_and_oversize_are_caught() {
        let mut p = Pdu::new(op::SCSI_CMD);
        p.data = vec![7; 100];
        let mut bytes = p.encode(true, true);
        bytes[20] ^= 1;
        assert!(matches!(
            Pdu::read(&mut &bytes[..], true, true, 1024).await,
            Err(PduError::HeaderDigest)
        ));
        let mut bytes = p.encode(true, true);
        bytes[60] ^= 1;
        assert!(matches!(
            Pdu::read(&mut &bytes[..], true, true, 1024).await,
            Err(PduError::DataDigest { .. })
        ));
        let bytes = p.encode(false, false);
        assert!(matches!(
            Pdu::read(&mut &bytes[..], false, false, 64).await,
            Err(PduError::TooLong { .. })
        ));
        assert!(Pdu::read(&mut &bytes[..30], false, false, 1024).await.is_err());
    }
}
