//! How a record that belongs to no held event starts one: emitted at once,
//! held for its follow-up lines, or only remembered (identity lines).

use super::*;

impl Scanner {
    /// Starts the event `msg` opens: emitted at once, or held for the lines that
    /// belong to it. Lines that only describe (a GPU's identity and serial) are
    /// remembered; continuation lines without a report are dropped.
    pub(super) fn start(
        &mut self,
        meta: RecordMeta,
        msg: Message<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        match msg {
            Message::Xid(x) => self.start_xid(meta, &x, raw, out),
            Message::Sxid(s) => self.start_sxid(&meta, &s, raw),
            Message::GpuIdentity(id) => self.note_identity(id.pci, id.uuid),
            Message::GpuSerial(serial) => {
                if let Some(i) = self.last_identity.take()
                    && let Some(id) = self.identities.get_mut(i)
                {
                    id.serial = Some(serial.to_owned());
                }
            }
            Message::AerSummary(s) => self.start_aer_summary(&meta, s, raw),
            Message::AerDetail(AerDetail::BusError {
                device,
                severity,
                error_type,
            }) => {
                let mut ev = self.event(FaultKind::PcieAer, &meta, raw);
                ev.pci_address = norm(device);
                attr(&mut ev, "aer_severity", severity.as_str());
                if let Some(t) = error_type {
                    attr(&mut ev, "aer_type", t);
                }
                ev.name = aer_name(severity.as_str());
                let devices = if ev.pci_address.is_empty() {
                    Vec::new()
                } else {
                    vec![ev.pci_address.clone()]
                };
                self.hold(HeldKind::Aer, ev, devices);
            }
            // Waiting fallen-off-the-bus reports are kept apart from `held` (see
            // `Scanner::fallen_off`); the other lines only continue a report.
            Message::FallenOffBus { .. } | Message::AerDetail(_) | Message::NvrmOther { .. } => {}
            Message::Nvlink(n) => {
                let mut ev = self.event(FaultKind::Nvlink, &meta, raw);
                ev.pci_address = norm(n.pci);
                if let Some(l) = n.link {
                    attr(&mut ev, "link", l.to_string());
                }
                if let Some(f) = n.fatal {
                    attr(&mut ev, "fatal", f.to_string());
                }
                ev.name = "NVLink error".to_owned();
                self.emit(ev, out);
            }
            Message::Ecc(e) => self.emit_memory(&meta, FaultKind::Ecc, "ECC error", e, raw, out),
            Message::PageRetirement(e) => {
                let name = "Dynamic page retirement";
                self.emit_memory(&meta, FaultKind::PageRetirement, name, e, raw, out);
            }
            Message::RowRemap { ecc, failure } => {
                let name = if failure {
                    "Row remapping failure"
                } else {
                    "Row remapping"
                };
                let mut ev = self.memory_event(&meta, FaultKind::RowRemap, name, ecc, raw);
                attr(&mut ev, "row_remap_failure", failure.to_string());
                self.emit(ev, out);
            }
            Message::Thermal(t) => self.emit_thermal(&meta, t, raw, out),
            Message::Mce(m) => {
                let Some(part) = m.part else {
                    return;
                };
                let mut ev = self.event(FaultKind::MachineCheck, &meta, raw);
                mce_details(&mut ev, &m);
                ev.name = "Machine check exception".to_owned();
                self.hold(HeldKind::Mce, ev, Vec::new());
                if let Some(h) = &mut self.held {
                    h.mce_parts = mce_bit(part);
                }
            }
            Message::Peermem { function } => {
                let mut ev = self.event(FaultKind::Peermem, &meta, raw);
                if let Some(f) = function {
                    attr(&mut ev, "function", f);
                }
                ev.name = "nvidia-peermem error".to_owned();
                self.emit(ev, out);
            }
            Message::DriverError(d) => self.start_driver_error(&meta, &d, raw),
            Message::Nic(n) => self.emit_nic(&meta, n, raw, out),
        }
    }

    /// A NIC line (`mlx5_core`, or the transmit watchdog of any driver): one event
    /// of its own, at the NIC's PCI function (none for a watchdog line that does
    /// not print it), with `nic_event` and what the line names (`netdev`;
    /// `module`, `module_status`, `module_error`; `health_detail` and
    /// `health_fatal`, `fw_command` for a command timeout; `slot_power_watts`;
    /// `driver`, `tx_queue`, `tx_timeout_ms`). Its name and action are the
    /// policy's (by `nic_event`, `module_status` for module events,
    /// `health_fatal` for health events).
    fn emit_nic(&mut self, meta: &RecordMeta, n: NicMsg<'_>, raw: &str, out: &mut Sink<'_>) {
        let mut ev = self.event(FaultKind::Nic, meta, raw);
        ev.pci_address = norm(n.pci);
        attr(&mut ev, "nic_event", n.event.as_str());
        match n.event {
            NicEvent::Link { netdev, .. } => {
                if !netdev.is_empty() {
                    attr(&mut ev, "netdev", netdev);
                }
            }
            NicEvent::Module {
                module,
                status,
                error,
            } => {
                attr(&mut ev, "module", module.to_string());
                attr(&mut ev, "module_status", module_status(status));
                if let Some(e) = error {
                    attr(&mut ev, "module_error", e);
                }
            }
            NicEvent::Health { detail, fatal } => {
                attr(&mut ev, "health_detail", detail);
                if fatal {
                    attr(&mut ev, "health_fatal", "true");
                }
            }
            NicEvent::CmdTimeout { command, detail } => {
                attr(&mut ev, "health_detail", detail);
                attr(&mut ev, "health_fatal", "true");
                attr(&mut ev, "fw_command", command);
            }
            NicEvent::SlotPower { watts } => {
                if let Some(w) = watts {
                    attr(&mut ev, "slot_power_watts", w.to_string());
                }
            }
            NicEvent::TxTimeout {
                netdev,
                driver,
                queue,
                timeout_ms,
            } => {
                attr(&mut ev, "netdev", netdev);
                if let Some(d) = driver {
                    attr(&mut ev, "driver", d);
                }
                attr(&mut ev, "tx_queue", queue.to_string());
                if let Some(ms) = timeout_ms {
                    attr(&mut ev, "tx_timeout_ms", ms.to_string());
                }
            }
        }
        self.emit(ev, out);
    }

    /// An SXid line that no held report took. A head line starts a report; a
    /// follow-up line (`Severity …`, `Data {…}`, `SOE HALT data[…]`) whose head
    /// was seen — the same switch and code, within [`SXID_REPORT_USEC`] — belongs
    /// to that report and is dropped; without its head (a pasted excerpt, a head
    /// the ring overwrote) it is a report of its own: the switch said something
    /// went wrong, and saying nothing would lose it.
    fn start_sxid(&mut self, meta: &RecordMeta, s: &SxidMsg<'_>, raw: &str) {
        let switch = norm(Some(s.pci));
        let head_seen = self.last_sxid.iter().any(|(p, code, t)| {
            *p == switch
                && *code == s.code
                && match (t, meta.monotonic_usec) {
                    (Some(t), Some(now)) => now.saturating_sub(*t) <= SXID_REPORT_USEC,
                    _ => true,
                }
        });
        if s.followup && head_seen {
            return;
        }
        if !s.followup {
            note_sxid(&mut self.last_sxid, &switch, s.code, meta.monotonic_usec);
        }
        let mut ev = self.event(FaultKind::Sxid, meta, raw);
        ev.code = s.code;
        ev.pci_address = switch.clone();
        attr(&mut ev, "nvswitch", switch);
        if let Some(f) = s.fatal {
            attr(&mut ev, "fatal", f.to_string());
        }
        if let Some(l) = s.link {
            attr(&mut ev, "sxid_link", l.to_string());
        }
        if s.followup {
            attr(&mut ev, "sxid_head", "absent");
            ev.name = format!("SXid {} (report head not in the log)", s.code);
        } else {
            let name = s.detail.split_once(", ").map_or(s.detail, |x| x.1).trim();
            ev.name = name.trim_end_matches("(First)").trim_end().to_owned();
        }
        self.hold(HeldKind::Sxid, ev, Vec::new());
    }

    /// `NVRM: GPU at PCI:<pci>: <uuid>`: later events of that address carry the UUID
    /// (and the serial printed next, see [`Message::GpuSerial`]).
    fn note_identity(&mut self, pci: &str, uuid: &str) {
        let pci = norm(Some(pci));
        let idx = match self.identities.iter().position(|i| i.pci == pci) {
            Some(i) => {
                self.identities[i].uuid = uuid.to_owned();
                i
            }
            None => {
                if self.identities.len() >= MAX_IDENTITIES {
                    self.identities.remove(0);
                }
                self.identities.push(KnownGpu {
                    pci,
                    uuid: uuid.to_owned(),
                    serial: None,
                });
                self.identities.len() - 1
            }
        };
        self.last_identity = Some(idx);
    }

    /// An AER summary (`AER: Corrected error received: <source>`): held for the
    /// detail lines of the devices it names.
    fn start_aer_summary(&mut self, meta: &RecordMeta, s: AerSummary<'_>, raw: &str) {
        let reporter = norm(Some(s.reporter));
        let mut ev = self.event(FaultKind::PcieAer, meta, raw);
        ev.pci_address = s.source.clone().unwrap_or_else(|| reporter.clone());
        attr(&mut ev, "aer_severity", s.severity.as_str());
        attr(&mut ev, "aer_reporter", reporter.clone());
        ev.name = aer_name(s.severity.as_str());
        let mut devices = vec![reporter];
        if let Some(src) = s.source
            && src != devices[0]
        {
            devices.push(src);
        }
        self.hold(HeldKind::Aer, ev, devices);
    }

    /// An ECC, page-retirement or row-remap event of one line.
    fn memory_event(
        &mut self,
        meta: &RecordMeta,
        kind: FaultKind,
        name: &str,
        e: EccMsg<'_>,
        raw: &str,
    ) -> FaultEvent {
        let mut ev = self.event(kind, meta, raw);
        ev.pci_address = norm(e.pci);
        if let Some(t) = e.ecc_type {
            attr(&mut ev, "ecc_type", t);
        }
        ev.name = name.to_owned();
        ev
    }

    fn emit_memory(
        &mut self,
        meta: &RecordMeta,
        kind: FaultKind,
        name: &str,
        e: EccMsg<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        let ev = self.memory_event(meta, kind, name, e, raw);
        self.emit(ev, out);
    }

    /// A thermal line: the GPU's when it names a PCI address or comes from the
    /// NVIDIA driver, else the host CPU's (the x86 thermal-throttle messages,
    /// `CPU3: Core temperature above threshold …`, with or without `mce: `).
    /// `thermal_sensor` says which (`gpu`, `cpu_core`, `cpu_package`, `cpu`); the
    /// policy's reason follows it.
    fn emit_thermal(
        &mut self,
        meta: &RecordMeta,
        t: ThermalMsg<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        let mut ev = self.event(FaultKind::Thermal, meta, raw);
        ev.pci_address = norm(t.pci);
        if let Some(c) = t.temperature_c {
            attr(&mut ev, "temperature_c", c.to_string());
        }
        let gpu = t.pci.is_some() || contains!(raw, "NVRM");
        let sensor = if gpu {
            "gpu"
        } else if contains!(raw, "Package temperature") {
            "cpu_package"
        } else if contains!(raw, "Core temperature") {
            "cpu_core"
        } else {
            "cpu"
        };
        attr(&mut ev, "thermal_sensor", sensor);
        if !gpu && let Some(cpu) = cpu_number(raw) {
            attr(&mut ev, "cpu", cpu.to_string());
        }
        ev.name = if gpu {
            "GPU thermal slowdown".to_owned()
        } else {
            "CPU temperature above threshold".to_owned()
        };
        self.emit(ev, out);
    }

    /// A driver error (`RmInitAdapter failed`, a failed probe): held for the
    /// driver's lines that explain it.
    fn start_driver_error(&mut self, meta: &RecordMeta, d: &DriverErrorMsg<'_>, raw: &str) {
        let mut ev = self.event(FaultKind::DriverError, meta, raw);
        ev.pci_address = norm(d.pci);
        attr(
            &mut ev,
            "driver_error",
            match d.code {
                Some(c) => format!("{} ({c})", d.error),
                None => d.error.to_owned(),
            },
        );
        ev.name = match d.error {
            "rm_init_adapter_failed" => "GPU initialisation failed (RmInitAdapter)",
            "probe_failed" => "NVIDIA driver probe failed",
            "no_devices_initialized" => "No NVIDIA GPU initialised",
            "gpu_lost" => "GPU lost",
            _ => "NVIDIA driver error",
        }
        .to_owned();
        self.hold(HeldKind::DriverError, ev, Vec::new());
    }

    /// An XID line. Its event is built borrowed, from the line, the identity table and
    /// the policy: a line that is its own event (nearly all) is decided and handed out
    /// without an owned copy; only a line that waits for more (a GSP dump, the other
    /// lines of one fault, a GPU's fallen-off report) becomes an owned event.
    pub(super) fn start_xid(
        &mut self,
        meta: RecordMeta,
        x: &XidMsg<'_>,
        raw: &str,
        out: &mut Sink<'_>,
    ) {
        let interned = self.pci_name(x.pci);
        // An address edited before the log was pasted: reported as given when it still
        // names a bus and device, else unknown; the line is never dropped.
        let edited = match interned {
            Some(_) => None,
            None => Some(crate::pci::edited_pci(x.pci)),
        };
        let pci = match (interned, &edited) {
            (Some(i), _) => self.pci_names[i].1.as_str(),
            (None, Some(e)) => e.as_deref().unwrap_or(""),
            (None, None) => "",
        };
        let waits = matches!(x.code, 119 | 120)
            || (x.pid.is_none() && x.code_as_printed.is_none() && multi_line_xid(x.code))
            || (x.code == 79 && !self.fallen.is_empty());
        if x.code == 79 {
            note_fallen(&mut self.last_fallen, pci, meta.monotonic_usec);
        }
        let id = self
            .identities
            .iter()
            .find(|i| !pci.is_empty() && same_text(&i.pci, pci));
        let mut link = [0u8; 10];
        let mut attrs = [("", ""); 16];
        let mut n = 0;
        let mut add = |pair| insert_attr(&mut attrs, &mut n, pair);
        if let Some(e) = &edited {
            add(("pci_as_printed", x.pci));
            add((
                "pci_note",
                match e {
                    Some(_) => "device number above 0x1f: not a valid PCI address",
                    None => "address redacted: GPU unknown",
                },
            ));
        }
        xid_line_attrs(x, self.driver_version.as_deref(), &mut link, &mut add);
        if let Some(s) = id.and_then(|i| i.serial.as_deref()) {
            add(("gpu_serial", s));
        }
        let mut view = FaultEventRef {
            kind: FaultKind::Xid as i32,
            code: x.code,
            pci_address: pci,
            gpu_uuid: id.map_or("", |i| i.uuid.as_str()),
            pid: x.pid,
            process: x.process.unwrap_or(""),
            message: raw,
            kmsg_seq: meta.seq,
            monotonic_usec: meta.monotonic_usec,
            time_unix_nano: meta.time_unix_nano,
            facility: meta.facility.map(u32::from),
            level: meta.level.map(u32::from),
            count: 1,
            attributes: Attrs::list(&attrs[..n]),
            ..FaultEventRef::EMPTY
        };
        if !waits {
            let d = self.policy.decide_xid(&mut self.ctx, &view);
            // A context rule's attribute joins a copy of the list (most decisions
            // have none, and the list stays as built).
            let with_context;
            if let Some(c) = &d.context {
                let (mut all, mut m) = ([("", ""); 17], n);
                all[..n].copy_from_slice(&attrs[..n]);
                insert_attr(&mut all, &mut m, ("context", c));
                with_context = (all, m);
                view.attributes = Attrs::list(&with_context.0[..with_context.1]);
            }
            view.action = d.action as i32;
            view.severity = d.action.default_severity() as i32;
            view.policy_reason = &d.reason;
            view.name = &d.name;
            match out {
                Sink::Owned(v) => {
                    let mut owned = self.spare.pop().unwrap_or_default();
                    view.write_into(&mut owned);
                    v.push(owned);
                }
                Sink::View(f) => f(&view),
            }
            return;
        }
        // Classified when it is emitted (see `emit`).
        let mut ev = self.spare.pop().unwrap_or_default();
        view.write_into(&mut ev);
        self.hold_xid(ev, out);
    }

    /// Holds an XID event that waits for more lines: XID 119/120 for the GSP dump,
    /// an XID 79 among waiting fallen-off-the-bus reports, any other for the other
    /// lines of one fault.
    fn hold_xid(&mut self, mut ev: FaultEvent, out: &mut Sink<'_>) {
        if ev.code == 79 {
            // A waiting `fallen off the bus` report of the same GPU was the prelude of
            // this XID 79: one event, the XID's, with the report's lines first. It keeps
            // its place among the other GPUs' reports (input order).
            if let Some(h) = self
                .fallen
                .iter_mut()
                .find(|h| h.ev.pci_address == ev.pci_address)
            {
                ev.message = format!("{}\n{}", h.ev.message, ev.message);
                h.ev = ev;
                return;
            }
            if !self.fallen.is_empty() {
                if self.fallen.len() >= MAX_FALLEN_PENDING {
                    let oldest = self.fallen.remove(0);
                    self.emit_one(oldest, out);
                }
                let pci = ev.pci_address.clone();
                self.fallen
                    .push(Held::new(HeldKind::FallenOff, ev, vec![pci]));
                return;
            }
        }
        if matches!(ev.code, 119 | 120) {
            self.hold(HeldKind::Gsp, ev, Vec::new());
        } else {
            self.hold(HeldKind::Xid, ev, Vec::new());
        }
    }
}
