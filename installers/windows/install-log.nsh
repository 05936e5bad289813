; install.log for hone-studio.nsi: everything an install or a repair did, in one file users can send us.
;
; With a window, every line goes to the details list (DetailPrint, nsExec::ExecToLog) and DumpDetails appends the
; lines added since its last call to install.log. A silent install (/S) has no details list, so `Note` also appends
; its line to the file itself and steps' output is redirected there (see RunStep in hone-studio.nsi).
; The environment step (hone.core.install apply --log) appends its own lines to the same file while it runs; the
; installer holds no handle on the file meanwhile.

!include LogicLib.nsh
!include WinMessages.nsh

!define LOG_FILE "$INSTDIR\install.log"
!define DETAILS_LIST_ID 1016  ; the control id of the instfiles page's details list view
; LVITEMW on amd64: mask, iItem, iSubItem, state, stateMask, 4 bytes of padding, then the pszText pointer and
; cchTextMax; 88 bytes in all (the later fields stay zero)
!define LVITEM_SIZE 88
!define /math TEXT_BYTES ${NSIS_MAX_STRLEN} * 2  ; one details line, UTF-16

Var LoggedLines  ; how many details lines install.log holds already

; DetailPrint `text`, and in a silent install append it to install.log.
!macro Note text
    Push `${text}`
    Call Note
!macroend
!define Note "!insertmacro Note"

Function Note
    Exch $0
    Push $1
    DetailPrint $0
    ${If} ${Silent}
        ; FileWrite converts to the ANSI code page, like the apply step's lines next to ours
        FileOpen $1 "${LOG_FILE}" a
        FileSeek $1 0 END
        FileWrite $1 "$0$\r$\n"
        FileClose $1
    ${EndIf}
    Pop $1
    Pop $0
FunctionEnd

; Append the details list's new lines to install.log (nothing in a silent install: there is no list).
Function DumpDetails
    ${If} ${Silent}
        Return
    ${EndIf}
    Push $0  ; the list view
    Push $1  ; its line count
    Push $2  ; text buffer
    Push $3  ; LVITEMW
    Push $4  ; the file
    Push $5  ; line index
    Push $6  ; line text
    Push $7  ; where the list put the text
    FindWindow $0 "#32770" "" $HWNDPARENT
    GetDlgItem $0 $0 ${DETAILS_LIST_ID}
    ${If} $0 <> 0
        SendMessage $0 ${LVM_GETITEMCOUNT} 0 0 $1
        System::Alloc ${TEXT_BYTES}
        Pop $2
        System::Alloc ${LVITEM_SIZE}
        Pop $3
        FileOpen $4 "${LOG_FILE}" a
        FileSeek $4 0 END
        IntOp $5 $LoggedLines + 0  ; "" before the first dump
        ${While} $5 < $1
            System::Call "*$3(i 0, i r5, i 0, i 0, i 0, i 0, p r2, i ${NSIS_MAX_STRLEN})"
            SendMessage $0 ${LVM_GETITEMTEXT} $5 $3
            ; the list may answer with a pointer to its own copy: read pszText back
            System::Call "*$3(i, i, i, i, i, i, p .r7)"
            System::Call "*$7(&t${NSIS_MAX_STRLEN} .r6)"
            FileWrite $4 "$6$\r$\n"
            IntOp $5 $5 + 1
        ${EndWhile}
        FileClose $4
        System::Free $2
        System::Free $3
        StrCpy $LoggedLines $1
    ${EndIf}
    Pop $7
    Pop $6
    Pop $5
    Pop $4
    Pop $3
    Pop $2
    Pop $1
    Pop $0
FunctionEnd
