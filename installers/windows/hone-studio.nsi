; Hone Studio's Windows installer (NSIS 3, Modern UI 2), built on Linux by build.sh, which defines:
;   VERSION, FILE_VERSION (four numbers), OUTFILE, WHEEL (the wheel's file name) and PAYLOAD (a folder holding
;   uv.exe, the wheel, constraints.txt and hone.ico).
;
; Installs for the current user into %LOCALAPPDATA%\Programs\HoneStudio. The files come first (uv, the wheel, the
; uninstaller, Add/Remove Programs entry, "Repair Hone Studio" shortcut); then the environment step: uv installs
; Python 3.12 and a venv there, the wheel goes in without its dependencies, and Hone's own step
; (`python -m hone.core.install apply`) installs the rest with the torch build that fits the NVIDIA driver. The "Hone Studio" shortcut is made only once that has succeeded.
;
; Command line: /S silent; /REPAIR runs the environment step again (the Start menu's "Repair Hone Studio");
; /CPU installs the CPU build of torch even where an NVIDIA driver is found; /D=FOLDER installs elsewhere.
; A failed step offers Retry/Cancel and names install.log; a silent install exits non-zero instead: the apply
; step's code (3: computer not supported, 4: a download failed, 5: PyTorch installed but not working) or 2.

Unicode true
Target amd64-unicode
SetCompressor /SOLID lzma
ManifestDPIAware true

!include MUI2.nsh
!include nsDialogs.nsh
!include LogicLib.nsh
!include FileFunc.nsh
!include "install-log.nsh"

!define APP "Hone Studio"
!define UNINSTALL_KEY "Software\Microsoft\Windows\CurrentVersion\Uninstall\HoneStudio"
!define SETTINGS_KEY "Software\Hone\Hone Studio"  ; the Studio's QSettings (app/settings.py)
!define DRIVERS_URL "https://www.nvidia.com/drivers"
!define PYTHON_VERSION "3.12"

Name "${APP}"
OutFile "${OUTFILE}"
InstallDir "$LOCALAPPDATA\Programs\HoneStudio"
InstallDirRegKey HKCU "${UNINSTALL_KEY}" "InstallLocation"
RequestExecutionLevel user
ShowInstDetails show
ShowUninstDetails show
BrandingText "${APP} ${VERSION}"

VIProductVersion "${FILE_VERSION}"
VIAddVersionKey "ProductName" "${APP}"
VIAddVersionKey "ProductVersion" "${VERSION}"
VIAddVersionKey "FileVersion" "${VERSION}"
VIAddVersionKey "CompanyName" "${APP}"
VIAddVersionKey "FileDescription" "${APP} ${VERSION} setup"
VIAddVersionKey "LegalCopyright" "${APP}"

Var Repair     ; 1: /REPAIR, the environment step only
Var Cpu        ; 1: install the CPU build (/CPU, or no NVIDIA driver)
Var HasDriver  ; 1: $SYSDIR\nvidia-smi.exe exists
Var EnvOk      ; 1: the environment step succeeded
Var StepName   ; RunStep's arguments: what the step is called in messages,
Var StepCmd    ; its command line,
Var StepOwnLog ; and 1 when it writes install.log itself

; ---- pages ----
!define MUI_ICON "${PAYLOAD}/hone.ico"
!define MUI_UNICON "${PAYLOAD}/hone.ico"
!define MUI_ABORTWARNING
!define MUI_FINISHPAGE_NOAUTOCLOSE  ; keep the details (uv's downloads) on screen until Next
!define MUI_UNFINISHPAGE_NOAUTOCLOSE

!define MUI_WELCOMEPAGE_TEXT "Setup will install ${APP} ${VERSION} for your user account.$\r$\n$\r$\n\
It downloads Python ${PYTHON_VERSION}, PyTorch and the other libraries Hone Studio needs (several GB), so keep \
this computer online while it runs.$\r$\n$\r$\nClick Next to continue."
!define MUI_PAGE_CUSTOMFUNCTION_PRE SkipInRepair
!insertmacro MUI_PAGE_WELCOME
Page custom DriverPageCreate
!define MUI_PAGE_CUSTOMFUNCTION_PRE SkipInRepair
!insertmacro MUI_PAGE_COMPONENTS
!insertmacro MUI_PAGE_INSTFILES
!define MUI_PAGE_CUSTOMFUNCTION_PRE FinishPagePre
!define MUI_FINISHPAGE_RUN
!define MUI_FINISHPAGE_RUN_TEXT "Start ${APP}"
!define MUI_FINISHPAGE_RUN_FUNCTION StartStudio
!insertmacro MUI_PAGE_FINISH

!insertmacro MUI_UNPAGE_CONFIRM
!insertmacro MUI_UNPAGE_INSTFILES

!insertmacro MUI_LANGUAGE "English"

Function .onInit
    ${GetParameters} $R0
    StrCpy $Repair 0
    ClearErrors
    ${GetOptions} $R0 "/REPAIR" $R1
    ${IfNot} ${Errors}
        StrCpy $Repair 1
    ${EndIf}
    StrCpy $Cpu 0
    ClearErrors
    ${GetOptions} $R0 "/CPU" $R1
    ${IfNot} ${Errors}
        StrCpy $Cpu 1
    ${EndIf}
    ; The driver installs nvidia-smi.exe into System32; without it no CUDA build of torch can run
    StrCpy $HasDriver 0
    ${If} ${FileExists} "$SYSDIR\nvidia-smi.exe"
        StrCpy $HasDriver 1
    ${Else}
        StrCpy $Cpu 1
    ${EndIf}
    StrCpy $EnvOk 0
FunctionEnd

Function SkipInRepair
    ${If} $Repair == 1
        Abort
    ${EndIf}
FunctionEnd

Function DriverPageCreate
    ${If} $HasDriver == 1
        Abort
    ${EndIf}
    !insertmacro MUI_HEADER_TEXT "No NVIDIA GPU driver found" "${APP} will install its CPU build."
    nsDialogs::Create 1018
    Pop $0
    ${NSD_CreateLabel} 0 0 100% 30u "No NVIDIA GPU driver was found on this computer, so ${APP} will install its \
CPU build. It works, but training on the CPU is very slow."
    Pop $0
    ${NSD_CreateLabel} 0 38u 100% 12u "To train on an NVIDIA GPU, install its driver from"
    Pop $0
    ${NSD_CreateLink} 0 52u 100% 12u "${DRIVERS_URL}"
    Pop $0
    SetCtlColors $0 0x0B5CAD transparent  ; a link's colour: the default renders pale grey on some systems
    ${NSD_OnClick} $0 OpenDriversPage
    ${NSD_CreateLabel} 0 68u 100% 24u 'then run "Repair ${APP}" from the Start menu: it switches to the GPU build.'
    Pop $0
    ${NSD_CreateLabel} 0 100u 100% 12u "Click Continue to install the CPU build now."
    Pop $0
    GetDlgItem $0 $HWNDPARENT 1
    SendMessage $0 ${WM_SETTEXT} 0 "STR:Continue"
    nsDialogs::Show
FunctionEnd

Function OpenDriversPage
    Pop $0
    ExecShell "open" "${DRIVERS_URL}"
FunctionEnd

Function FinishPagePre
    ${If} $EnvOk != 1
        Abort
    ${EndIf}
FunctionEnd

Function StartStudio
    Exec '"$INSTDIR\venv\Scripts\hone-studio.exe"'
FunctionEnd

; ---- install ----
Section "${APP}" SecApp
    SectionIn RO
    ; What the environment step adds: Python (~0.1 GB), PyTorch's CUDA build with its CUDA libraries (~4.5 GB), the
    ; other libraries (~1 GB) and uv's download cache; the components page shows the total (in KB)
    AddSize 6000000
    CreateDirectory "$INSTDIR"
    ${GetTime} "" "L" $0 $1 $2 $3 $4 $5 $6
    ${Note} "${APP} ${VERSION} setup, $2-$1-$0 $4:$5:$6, $EXEPATH $CMDLINE"
    ${If} $Repair == 1
        ${IfNot} ${FileExists} "$INSTDIR\payload\constraints.txt"
            ${Note} "Repair: ${APP} is not installed in $INSTDIR"
            Call DumpDetails
            MessageBox MB_OK|MB_ICONSTOP "${APP} is not installed in $INSTDIR, so there is nothing to repair: \
run the setup without /REPAIR." /SD IDOK
            SetErrorLevel 2
            Abort
        ${EndIf}
    ${Else}
        Call InstallFiles
    ${EndIf}
    Call EnvironmentStep
    CreateShortCut "$SMPROGRAMS\${APP}\${APP}.lnk" "$INSTDIR\venv\Scripts\hone-studio.exe" "" "$INSTDIR\hone.ico"
    ${Note} "Created the Start menu shortcut $SMPROGRAMS\${APP}\${APP}.lnk"
    ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
    WriteRegDWORD HKCU "${UNINSTALL_KEY}" "EstimatedSize" $0
SectionEnd

Section /o "Desktop shortcut" SecDesktop
    CreateShortCut "$DESKTOP\${APP}.lnk" "$INSTDIR\venv\Scripts\hone-studio.exe" "" "$INSTDIR\hone.ico"
    ${Note} "Created the desktop shortcut $DESKTOP\${APP}.lnk"
SectionEnd

Section "-Log"
    ${Note} "Done."
    Call DumpDetails
SectionEnd

!insertmacro MUI_FUNCTION_DESCRIPTION_BEGIN
    !insertmacro MUI_DESCRIPTION_TEXT ${SecApp} "The app, with Python ${PYTHON_VERSION} and PyTorch in its own folder."
    !insertmacro MUI_DESCRIPTION_TEXT ${SecDesktop} "A ${APP} shortcut on the desktop."
!insertmacro MUI_FUNCTION_DESCRIPTION_END

; The payload, this setup (for Repair), the uninstaller, Add/Remove Programs and the Repair shortcut.
Function InstallFiles
    ${Note} "Copying ${APP}'s files to $INSTDIR"
    SetOutPath "$INSTDIR\bin"
    File "${PAYLOAD}/uv.exe"
    SetOutPath "$INSTDIR\payload"
    File "${PAYLOAD}/${WHEEL}"
    File "${PAYLOAD}/constraints.txt"
    SetOutPath "$INSTDIR"
    File "${PAYLOAD}/hone.ico"
    ${If} $EXEPATH != "$INSTDIR\HoneStudio-Setup.exe"
        CopyFiles /SILENT "$EXEPATH" "$INSTDIR\HoneStudio-Setup.exe"
    ${EndIf}
    WriteUninstaller "$INSTDIR\Uninstall.exe"

    WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayName" "${APP}"
    WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayVersion" "${VERSION}"
    WriteRegStr HKCU "${UNINSTALL_KEY}" "Publisher" "${APP}"
    WriteRegStr HKCU "${UNINSTALL_KEY}" "DisplayIcon" "$INSTDIR\hone.ico"
    WriteRegStr HKCU "${UNINSTALL_KEY}" "InstallLocation" "$INSTDIR"
    WriteRegStr HKCU "${UNINSTALL_KEY}" "UninstallString" '"$INSTDIR\Uninstall.exe"'
    WriteRegStr HKCU "${UNINSTALL_KEY}" "QuietUninstallString" '"$INSTDIR\Uninstall.exe" /S'
    ; "Modify" in Settings > Apps runs the repair; there is no separate Repair button
    WriteRegStr HKCU "${UNINSTALL_KEY}" "ModifyPath" '"$INSTDIR\HoneStudio-Setup.exe" /REPAIR'
    WriteRegDWORD HKCU "${UNINSTALL_KEY}" "NoRepair" 1
    ${GetSize} "$INSTDIR" "/S=0K" $0 $1 $2
    WriteRegDWORD HKCU "${UNINSTALL_KEY}" "EstimatedSize" $0
    ${Note} "Registered ${APP} in Add/Remove Programs (HKCU\${UNINSTALL_KEY})"

    CreateDirectory "$SMPROGRAMS\${APP}"
    CreateShortCut "$SMPROGRAMS\${APP}\Repair ${APP}.lnk" "$INSTDIR\HoneStudio-Setup.exe" "/REPAIR" "$INSTDIR\hone.ico"
    ${Note} "Created the Start menu shortcut $SMPROGRAMS\${APP}\Repair ${APP}.lnk"
FunctionEnd

; Python, the venv, and Hone with torch in it. Aborts the install when a step fails and the user cancels.
Function EnvironmentStep
    ; uv keeps its Python, its downloads and nothing else inside $INSTDIR, and ignores any uv.toml of the user's
    System::Call 'Kernel32::SetEnvironmentVariable(t "UV_PYTHON_INSTALL_DIR", t "$INSTDIR\python")i'
    System::Call 'Kernel32::SetEnvironmentVariable(t "UV_CACHE_DIR", t "$INSTDIR\cache")i'
    System::Call 'Kernel32::SetEnvironmentVariable(t "UV_NO_CONFIG", t "1")i'
    ${If} $Cpu == 1
        ${Note} "Installing the CPU build of PyTorch (no NVIDIA driver found, or /CPU)"
    ${EndIf}

    ; --no-bin, --no-registry: no python3.12.exe in ~\.local\bin and no PEP 514 registry entry, which the
    ; uninstaller would leave behind
    StrCpy $StepName "Installing Python ${PYTHON_VERSION} (uv python install)"
    StrCpy $StepCmd '"$INSTDIR\bin\uv.exe" python install ${PYTHON_VERSION} --no-bin --no-registry'
    StrCpy $StepOwnLog 0
    Call RunStep

    ; --clear: a repair starts from an empty venv (the downloads stay in the cache)
    StrCpy $StepName "Creating the Python environment (uv venv)"
    StrCpy $StepCmd '"$INSTDIR\bin\uv.exe" venv "$INSTDIR\venv" --python ${PYTHON_VERSION} --managed-python --clear'
    Call RunStep

    ; Hone's own installer step is stdlib-only: the wheel goes in without its dependencies first, then it plans and
    ; installs the rest (a wheel on PYTHONPATH would not do: `hone` is a namespace package, which zip imports lack)
    StrCpy $StepName "Putting Hone into the environment (uv pip install --no-deps)"
    StrCpy $StepCmd '"$INSTDIR\bin\uv.exe" pip install --python "$INSTDIR\venv\Scripts\python.exe" --no-deps \
--reinstall-package hone-studio "$INSTDIR\payload\${WHEEL}"'
    Call RunStep

    StrCpy $StepName "Installing Hone and PyTorch (hone.core.install apply)"
    StrCpy $StepCmd '"$INSTDIR\venv\Scripts\python.exe" -m hone.core.install apply --uv "$INSTDIR\bin\uv.exe" \
--wheel "$INSTDIR\payload\${WHEEL}" --constraints "$INSTDIR\payload\constraints.txt" --venv "$INSTDIR\venv" \
--log "${LOG_FILE}"'
    ${If} $Cpu == 1
        StrCpy $StepCmd "$StepCmd --cpu"
    ${EndIf}
    StrCpy $StepOwnLog 1
    Call RunStep
    StrCpy $EnvOk 1
FunctionEnd

; Run $StepCmd until it succeeds; on failure offer Retry/Cancel (a silent install cancels).
Function RunStep
    retry:
    ${Note} "==> $StepName"
    ${Note} "$StepCmd"
    ${If} ${Silent}
        ${If} $StepOwnLog == 1
            nsExec::Exec $StepCmd
        ${Else}
            ; no details list to stream into: the output goes to install.log
            nsExec::Exec '"$SYSDIR\cmd.exe" /d /s /c "$StepCmd >>"${LOG_FILE}" 2>&1"'
        ${EndIf}
    ${Else}
        nsExec::ExecToLog $StepCmd
    ${EndIf}
    Pop $0  ; the exit code, or "error" when it could not start
    ${If} $0 == 0
        Return
    ${EndIf}

    ${Note} "FAILED: $StepName (exit code $0)"
    Call DumpDetails
    ${If} $0 == 3
        StrCpy $1 "This computer is not supported; the details above say why."
    ${ElseIf} $0 == 4
        StrCpy $1 "A download failed: check the internet connection, then click Retry."
    ${ElseIf} $0 == 5
        StrCpy $1 "PyTorch was installed but does not work on this computer; the details above say why."
    ${Else}
        StrCpy $1 "The details above say what went wrong."
    ${EndIf}
    MessageBox MB_RETRYCANCEL|MB_ICONEXCLAMATION "This step failed: $StepName.$\r$\n$\r$\n$1$\r$\n$\r$\nEverything \
setup did is in ${LOG_FILE}: if Retry does not help, send us install.log." /SD IDCANCEL IDRETRY retry
    ${If} $0 == 3
    ${OrIf} $0 == 4
    ${OrIf} $0 == 5
        SetErrorLevel $0
    ${Else}
        SetErrorLevel 2
    ${EndIf}
    Abort "$StepName failed; see ${LOG_FILE}"
FunctionEnd

; ---- uninstall ----
Section "Uninstall"
    Delete "$SMPROGRAMS\${APP}\${APP}.lnk"
    Delete "$SMPROGRAMS\${APP}\Repair ${APP}.lnk"
    RMDir "$SMPROGRAMS\${APP}"
    Delete "$DESKTOP\${APP}.lnk"

    ; What setup made, by name, then the folder only when it is empty: /D= may have pointed at a folder that
    ; holds other things too
    RMDir /r "$INSTDIR\venv"
    RMDir /r "$INSTDIR\python"
    RMDir /r "$INSTDIR\cache"
    RMDir /r "$INSTDIR\payload"
    RMDir /r "$INSTDIR\bin"
    Delete "$INSTDIR\hone.ico"
    Delete "$INSTDIR\install.log"
    Delete "$INSTDIR\HoneStudio-Setup.exe"
    Delete "$INSTDIR\Uninstall.exe"
    RMDir "$INSTDIR"
    DeleteRegKey HKCU "${UNINSTALL_KEY}"

    MessageBox MB_YESNO|MB_ICONQUESTION|MB_DEFBUTTON2 "Also delete your ${APP} runs, caches and settings?\
$\r$\n$\r$\nRuns: $DOCUMENTS\${APP}$\r$\nCaches: $LOCALAPPDATA\HoneStudio$\r$\n$\r$\nChoose No to keep them: \
installing ${APP} again finds them." /SD IDNO IDNO keep
        RMDir /r "$DOCUMENTS\${APP}"
        RMDir /r "$LOCALAPPDATA\HoneStudio"
        DeleteRegKey HKCU "${SETTINGS_KEY}"
        DeleteRegKey /ifempty HKCU "Software\Hone"
    keep:
SectionEnd
