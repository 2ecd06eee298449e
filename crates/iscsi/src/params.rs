//! Operational parameters and their negotiation (RFC 7143 section 13): what each side may send,
//! and the result functions (minimum, maximum, AND, OR, list choice) of each key.

/// What this target offers; the result of negotiation never exceeds it.
pub const OUR_MAX_RECV_DATA_SEGMENT: u32 = 256 << 10;
pub const OUR_MAX_BURST: u32 = 1 << 20;
pub const OUR_FIRST_BURST: u32 = 256 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Largest data segment we accept (declared by us).
    pub max_recv_data_segment: u32,
    /// Largest data segment we may send (declared by the initiator).
    pub max_xmit_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_connections: u32,
    pub error_recovery_level: u32,
}

impl Default for Params {
    /// The RFC's defaults, which hold for whatever is not negotiated.
    fn default() -> Params {
        Params {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment: 8192,
            max_xmit_data_segment: 8192,
            max_burst: 262144,
            first_burst: 65536,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            default_time2wait: 2,
            default_time2retain: 20,
            max_connections: 1,
            error_recovery_level: 0,
        }
    }
}

fn num(v: &str, lo: u32, hi: u32) -> Result<u32, ()> {
    let n: u32 = v.parse().map_err(|_| ())?;
    if n < lo || n > hi {
        return Err(());
    }
    Ok(n)
}

fn yes_no(v: &str) -> Result<bool, ()> {
    match v {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(()),
    }
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// The answer to one offered key: a value to send back, nothing (declarative keys), or
/// `Reject` for a value out of range.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    Value(String),
    Silent,
    NotUnderstood,
    Reject,
}

impl Params {
    /// Negotiates one operational key offered by the initiator.
    pub fn negotiate(&mut self, key: &str, v: &str) -> Answer {
        let r: Result<Answer, ()> = (|| {
            Ok(match key {
                "HeaderDigest" | "DataDigest" => {
                    // Our preference order is the initiator's: the first value we know.
                    let pick = v.split(',').find(|x| *x == "CRC32C" || *x == "None").ok_or(())?;
                    let on = pick == "CRC32C";
                    if key == "HeaderDigest" {
                        self.header_digest = on;
                    } else {
                        self.data_digest = on;
                    }
                    Answer::Value(pick.to_string())
                }
                "MaxRecvDataSegmentLength" => {
                    self.max_xmit_data_segment = num(v, 512, (1 << 24) - 1)?;
                    Answer::Silent
                }
                "MaxBurstLength" => {
                    self.max_burst = num(v, 512, (1 << 24) - 1)?.min(OUR_MAX_BURST);
                    Answer::Value(self.max_burst.to_string())
                }
                "FirstBurstLength" => {
                    self.first_burst = num(v, 512, (1 << 24) - 1)?.min(OUR_FIRST_BURST);
                    Answer::Value(self.first_burst.to_string())
                }
                "ImmediateData" => {
                    self.immediate_data = yes_no(v)?;
                    Answer::Value(yn(self.immediate_data))
                }
                "InitialR2T" => {
                    // OR: we are happy without, so the initiator decides.
                    self.initial_r2t = yes_no(v)?;
                    Answer::Value(yn(self.initial_r2t))
                }
                "MaxOutstandingR2T" => {
                    self.max_outstanding_r2t = num(v, 1, 65535)?.min(1);
                    Answer::Value(self.max_outstanding_r2t.to_string())
                }
                "DataPDUInOrder" | "DataSequenceInOrder" => {
                    // OR with our Yes: always Yes.
                    yes_no(v)?;
                    Answer::Value("Yes".into())
                }
                "DefaultTime2Wait" => {
                    self.default_time2wait = num(v, 0, 3600)?.max(2);
                    Answer::Value(self.default_time2wait.to_string())
                }
                "DefaultTime2Retain" => {
                    self.default_time2retain = num(v, 0, 3600)?.min(20);
                    Answer::Value(self.default_time2retain.to_string())
                }
                "MaxConnections" => {
                    self.max_connections = num(v, 1, 65535)?.min(1);
                    Answer::Value(self.max_connections.to_string())
                }
                "ErrorRecoveryLevel" => {
                    num(v, 0, 2)?;
                    self.error_recovery_level = 0;
                    Answer::Value("0".into())
                }
                "IFMarker" | "OFMarker" => {
                    yes_no(v)?;
                    Answer::Value("No".into())
                }
                "IFMarkInt" | "OFMarkInt" => Answer::Value("Irrelevant".into()),
                _ => Answer::NotUnderstood,
            })
        })();
        r.unwrap_or(Answer::Reject)
    }

    /// After negotiation: FirstBurstLength may not exceed MaxBurstLength.
    pub fn finish(&mut self) {
        self.first_burst = self.first_burst.min(self.max_burst);
        self.max_recv_data_segment = OUR_MAX_RECV_DATA_SEGMENT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_follow_the_rfc_functions() {
        let mut p = Params::default();
        assert_eq!(
            p.negotiate("HeaderDigest", "CRC32C,None"),
            Answer::Value("CRC32C".into())
        );
        assert!(p.header_digest);
        assert_eq!(p.negotiate("DataDigest", "None,CRC32C"), Answer::Value("None".into()));
        assert!(!p.data_digest);
        assert_eq!(
            p.negotiate("MaxBurstLength", "16776192"),
            Answer::Value(OUR_MAX_BURST.to_string())
        );
        assert_eq!(p.negotiate("FirstBurstLength", "4096"), Answer::Value("4096".into()));
        assert_eq!(p.negotiate("MaxRecvDataSegmentLength", "65536"), Answer::Silent);
        assert_eq!(p.max_xmit_data_segment, 65536);
        assert_eq!(p.negotiate("ImmediateData", "No"), Answer::Value("No".into()));
        assert_eq!(p.negotiate("MaxOutstandingR2T", "8"), Answer::Value("1".into()));
        assert_eq!(p.negotiate("DefaultTime2Wait", "0"), Answer::Value("2".into()));
        assert_eq!(p.negotiate("ErrorRecoveryLevel", "2"), Answer::Value("0".into()));
        assert_eq!(p.negotiate("X-com.example.Foo", "1"), Answer::NotUnderstood);
        assert_eq!(p.negotiate("MaxBurstLength", "12"), Answer::Reject);
        assert_eq!(p.negotiate("ImmediateData", "Maybe"), Answer::Reject);
        assert_eq!(p.negotiate("HeaderDigest", "MD5"), Answer::Reject);
        p.finish();
        assert!(p.first_burst <= p.max_burst);
    }
}
