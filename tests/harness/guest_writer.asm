; A guest that writes one known pattern to its second hard disk, then halts.
;
; Why a boot sector and not a Linux guest: the node tier already runs QEMU
; under emulation (TCG inside TCG); booting a kernel there takes minutes.
; This 512-byte real-mode program is booted by SeaBIOS from IDE disk 0 and
; writes through the BIOS: INT 13h AH=43h (EDD extended write) on drive 81h,
; which SeaBIOS turns into virtio-blk requests (the test puts the data disk on
; virtio-blk-pci). So the writes reach the block layer through a real guest
; device, with that device's werror policy: the path a Proxmox VM's writes
; take on ENOSPC. SeaBIOS polls the virtqueue without a timeout, so a request
; held across an ENOSPC pause simply completes after the resume.
;
; Assembled at test time (nasm -f bin) with the run's parameters:
;   -DSTART_LBA=n   first sector to write on drive 81h
;   -DSECTORS=n     how many sectors (at most 127 per INT 13h call, EDD's limit)
;   -DPATTERN=0xNN  the byte every written sector is filled with
;   -DDATA_DISK=0xNN  the BIOS drive to write (default 81h, the second disk)
;   -DGATE_LBA=n -DGATE_BYTE=0xNN  optional: before writing, read sector n of
;                   the data disk until its first byte is GATE_BYTE. The guest
;                   runs meanwhile (a migration of it keeps iterating, as for
;                   a busy guest) and writes only once the test wrote there.
;
; Progress and result on the isa-debugcon port 0E9h (one byte each):
;   'G'             the program runs (SeaBIOS booted it)
;   '.'             one INT 13h call (up to 127 sectors) completed
;   'S'             every sector written
;   'X'             drive 81h has no EDD extensions
;   'F' hh          INT 13h failed, hh = status (AH) in hex
; then it halts with interrupts off: the VM stays "running" with an idle CPU.

%ifndef START_LBA
%error "define START_LBA"
%endif
%ifndef SECTORS
%error "define SECTORS"
%endif
%ifndef PATTERN
%error "define PATTERN"
%endif

        bits 16
        org 0x7c00

DEBUGCON  equ 0xe9
%ifndef DATA_DISK
%define DATA_DISK 0x81
%endif
CHUNK     equ 127              ; EDD: at most 127 sectors per call
BUF_SEG   equ 0x1000           ; 64 KiB buffer at 0x10000, clear of us and the stack
GATE_SEG  equ 0x2000           ; the gate sector's buffer, past the write buffer

start:
        cli
        xor ax, ax
        mov ds, ax
        mov ss, ax
        mov sp, 0x7c00
        sti
        cld
        mov al, 'G'
        call putc

        ; One chunk's worth of pattern, reused by every call.
        mov ax, BUF_SEG
        mov es, ax
        xor di, di
        mov cx, CHUNK * 512
        mov al, PATTERN
        rep stosb

        ; EDD present on the data disk?
        mov ah, 0x41
        mov bx, 0x55aa
        mov dl, DATA_DISK
        int 0x13
        jc no_edd
        cmp bx, 0xaa55
        jne no_edd

%ifdef GATE_LBA
gate:
        mov ah, 0x42               ; EDD extended read of the gate sector
        mov dl, DATA_DISK
        mov si, gate_dap
        int 0x13
        jc failure
        push es
        mov ax, GATE_SEG
        mov es, ax
        mov al, [es:0]
        pop es
        cmp al, GATE_BYTE
        jne gate
%endif

next:
        mov eax, [remaining]
        test eax, eax
        jz success
        cmp eax, CHUNK
        jbe .count
        mov eax, CHUNK
.count:
        mov [dap_count], ax
        mov ah, 0x43
        mov al, 0                  ; write, no verify
        mov dl, DATA_DISK
        mov si, dap
        int 0x13
        jc failure
        mov al, '.'
        call putc
        movzx eax, word [dap_count]
        add [dap_lba], eax
        adc dword [dap_lba + 4], 0
        sub [remaining], eax
        jmp next

success:
        mov al, 'S'
        call putc
        jmp halt

no_edd:
        mov al, 'X'
        call putc
        jmp halt

failure:
        mov bl, ah
        mov al, 'F'
        call putc
        mov al, bl
        shr al, 4
        call puthex
        mov al, bl
        and al, 0x0f
        call puthex

halt:
        cli
.forever:
        hlt
        jmp .forever

; AL = 0..15 -> one hex digit on the debug port.
puthex:
        add al, '0'
        cmp al, '9'
        jbe putc
        add al, 'a' - '0' - 10
putc:
        push dx
        mov dx, DEBUGCON
        out dx, al
        pop dx
        ret

        align 4
remaining:  dd SECTORS
dap:                               ; EDD disk address packet
            db 0x10, 0             ; packet size, reserved
dap_count:  dw 0                   ; sectors this call
            dw 0, BUF_SEG          ; buffer offset, segment
dap_lba:    dq START_LBA
%ifdef GATE_LBA
gate_dap:   db 0x10, 0
            dw 1                   ; one sector
            dw 0, GATE_SEG
            dq GATE_LBA
%endif

        times 510 - ($ - $$) db 0
        dw 0xaa55
