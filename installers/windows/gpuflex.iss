; Inno Setup 6 script: the Windows installer for the PyInstaller bundle (dist\gpuflex).
; NOT RUN HERE (no Windows machine): built by .github/workflows/installers.yml on
; windows-latest:
;     pyinstaller --noconfirm --distpath dist --workpath build\pyinstaller installers\gpuflex.spec
;     iscc /DAppVersion=0.1.0 installers\windows\gpuflex.iss   ->  dist\GPUFlex-Setup-0.1.0.exe
;
; Per-user install (no admin prompt) into %LOCALAPPDATA%\Programs\GPUFlex, so that the
; bundle's own signed updater (desktop/updater.py, tufup) can replace it without elevation.
; Sign GPUFlex-Setup-*.exe and both programs with Authenticode (installers/README.md).

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "GPUFlex"
#define BundleDir "..\..\dist\gpuflex"

[Setup]
; a fixed AppId: upgrades replace the same installation
AppId={{6B0F3C52-6E1D-4C0B-9C2B-2F7E3D1A9A41}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=GPUFlex
AppPublisherURL=https://github.com/gpuflex/gpuflex
DefaultDirName={localappdata}\Programs\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=GPUFlex-Setup-{#AppVersion}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
UninstallDisplayIcon={app}\gpuflex-tray.exe
; the tray app may be running during an upgrade or uninstall: close it, restart it after
CloseApplications=yes
RestartApplications=yes

[Tasks]
Name: "autostart"; Description: "Start GPUFlex when I sign in"; GroupDescription: "Startup:"

[Files]
Source: "{#BundleDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\gpuflex-tray.exe"
Name: "{autoprograms}\{#AppName} (agent console)"; Filename: "{cmd}"; Parameters: "/k ""{app}\gpuflex-node.exe"" status"

[Registry]
; the same value the tray's own "start at login" setting writes (desktop/autostart.py), removed on uninstall
Root: HKCU; Subkey: "Software\Microsoft\Windows\CurrentVersion\Run"; ValueType: string; ValueName: "GPUFlex"; ValueData: """{app}\gpuflex-tray.exe"""; Tasks: autostart; Flags: uninsdeletevalue
Root: HKCU; Subkey: "Software\Microsoft\Windows\CurrentVersion\Run"; ValueName: "GPUFlex"; Flags: dontcreatekey uninsdeletevalue

[Run]
Filename: "{app}\gpuflex-tray.exe"; Description: "Start GPUFlex now"; Flags: nowait postinstall skipifsilent

[UninstallRun]
; stop the agent gracefully (its running task is kept) before the files go
Filename: "{app}\gpuflex-node.exe"; Parameters: "stop"; Flags: runhidden skipifdoesntexist; RunOnceId: "StopAgent"

[UninstallDelete]
; files the app writes inside its own folder after install (none expected; defensive)
Type: filesandordirs; Name: "{app}\update"
